"""Client-disconnect handling: a gone client must cancel its backend request.

Owns:

* ``run_until_disconnect``: vLLM's ``with_cancellation`` pattern; races a handler's work against
  ``http.disconnect`` so a non-streaming (or not yet streaming) request is cancelled when the
  client leaves;
* ``SSEResponse``: a streaming response that watches for the disconnect whatever the ASGI spec
  version, and always closes its event generator, which closes the backend stream and so cancels
  the gRPC call;
* ``ClientGoneResponse``: the 499 recorded for a request whose client left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Coroutine, Mapping
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)

T = TypeVar("T")

CLIENT_CLOSED_REQUEST = 499
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


async def _wait_for_disconnect(request: Request) -> None:
    # Only called after the body was read, so the next message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work``; cancel it and raise ``ClientDisconnected`` if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            # Let the work's cleanup (closing the backend stream) finish before we return.
            with anyio.CancelScope(shield=True):
                await asyncio.wait((task,))
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


class ClientGoneResponse(Response):
    """The answer to a request whose client left: 499 (nginx's code), for the access log only."""

    def __init__(self) -> None:
        super().__init__(status_code=CLIENT_CLOSED_REQUEST)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except OSError:
            # ASGI 2.4 servers raise on sends to a closed connection; nobody is there to tell.
            logger.debug("client gone before its 499 was sent")


class SSEResponse(StreamingResponse):
    """``text/event-stream`` over an async generator that is closed however the response ends."""

    def __init__(self, content: AsyncGenerator[bytes, None], headers: Mapping[str, str] | None = None) -> None:
        super().__init__(content, headers={**SSE_HEADERS, **(headers or {})}, media_type="text/event-stream")
        self._events = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        # ASGI 2.4 servers report a gone client this way; the watcher sees it too.
                        logger.debug("client went away during a stream")
                    group.cancel_scope.cancel()

                async def watch() -> None:
                    await self.listen_for_disconnect(receive)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                group.start_soon(watch)
        finally:
            with anyio.CancelScope(shield=True):
                await self._events.aclose()
