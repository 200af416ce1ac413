"""Request body limits: size and time.

Owns: ``BodySizeLimitMiddleware``, a pure ASGI middleware: a ``Content-Length`` over the limit is
answered 413 at once without reading the body, an invalid one 400; a body without a length
(chunked) is counted while it is read and stops with ``BodyTooLarge`` (-> 413) at the limit, so
no route ever buffers more than the limit. A body that has not arrived in full ``timeout_s`` after
the app first asks for it stops with ``BodyTimedOut`` (-> 408, and the connection closes): a
client that sends part of a body and then stalls holds nothing for long.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_frontend.aio import within
from openai_frontend.http.errors import BodyTimedOut, BodyTooLarge, error_response
from python_backend.protocol.errors import body_too_large, invalid_content_length


def _content_length(scope: Scope) -> int | None:
    """The declared length; raises ValueError when it is not one non-negative integer."""
    values = [value for name, value in scope.get("headers", []) if name == b"content-length"]
    if not values:
        return None
    if len(values) > 1 or not values[0].isdigit():
        raise ValueError("invalid Content-Length")
    return int(values[0])


class BodySizeLimitMiddleware:
    """Caps request bodies at ``max_bytes`` and the time to receive them at ``timeout_s``."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float | None = None) -> None:
        self.app = app
        self._max = max_bytes
        self._timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            declared = _content_length(scope)
        except ValueError:
            await error_response(invalid_content_length())(scope, receive, send)
            return
        if declared is not None and declared > self._max:
            await error_response(body_too_large(self._max))(scope, receive, send)
            return

        received = 0
        complete = False
        deadline: float | None = None

        async def counted_receive() -> Message:
            nonlocal received, complete, deadline
            if complete or self._timeout_s is None:
                message = await receive()  # after the body: the disconnect watchers' reads
            else:
                now = asyncio.get_running_loop().time()
                deadline = now + self._timeout_s if deadline is None else deadline
                try:
                    message = await within(receive(), max(deadline - now, 0.0))
                except TimeoutError as exc:
                    raise BodyTimedOut(self._timeout_s) from exc
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._max:
                    raise BodyTooLarge(self._max)
                complete = complete or not message.get("more_body", False)
            else:
                complete = True
            return message

        await self.app(scope, counted_receive, send)
