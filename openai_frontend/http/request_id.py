"""``X-Request-Id``: the id of every request, taken from the client when it is valid, and echoed.

Owns: ``RequestIdMiddleware`` (outermost, so every answer carries the header, a 401 or a 503
included), the validity rule and ``request_id_of``, through which routes read the id. A valid
incoming id (1-128 characters of letters, digits and ``._:-``) is used as is, so a client or a
proxy can find its request in responses and logs; anything else (absent, too long, other
characters, which could forge log lines) is replaced by a generated one. Chat answers use it in
their ``id`` (``chatcmpl-<id>``, as vLLM does). While the app handles a request the id is also
in a context variable, from which ``RequestIdLogFilter`` puts it on every log record emitted
meanwhile, uvicorn's access line included, so the JSON log lines of one request can be found by
the id the client saw.
"""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
_VALID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_STATE_KEY = "request_id"
LOG_FIELD = "request_id"  # the log record's attribute (and the JSON log line's key)
# Per asyncio task (and copied into worker threads): a request's id never shows in another's logs.
_CURRENT: ContextVar[str | None] = ContextVar("triton_chat_request_id", default=None)


@dataclass(frozen=True)
class RequestId:
    value: str
    given: bool  # the client's own (which it may have sent on other requests too)

    def answer_ids(self, prefix: str) -> AnswerIds:
        """The answer's ``id`` (``<prefix>-<value>``) and the model's request id for it."""
        response = f"{prefix}-{self.value}"
        # A client's id may repeat; the model's request ids must not.
        return AnswerIds(response, f"{response}-{uuid.uuid4().hex[:8]}" if self.given else "")


@dataclass(frozen=True)
class AnswerIds:
    response: str  # the answer's ``id``
    backend: str  # Triton's request id when it must differ from ``response``; "": the same


def is_valid_request_id(text: str) -> bool:
    return _VALID.fullmatch(text) is not None


def _incoming(scope: Scope) -> RequestId:
    for name, value in scope.get("headers", ()):
        if name == REQUEST_ID_HEADER.encode():
            text = value.decode("latin-1")
            if is_valid_request_id(text):
                return RequestId(text, given=True)
            break
    return RequestId(uuid.uuid4().hex, given=False)


def request_id_of(request: Request) -> RequestId:
    """The id ``RequestIdMiddleware`` gave this request (a fresh one in an app without it)."""
    found = request.scope.get("state", {}).get(_STATE_KEY)
    return found if isinstance(found, RequestId) else RequestId(uuid.uuid4().hex, given=False)


class RequestIdLogFilter(logging.Filter):
    """Adds ``request_id`` to each record logged while a request is handled; a record that
    already names one (logged with ``extra``) keeps it. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, LOG_FIELD, None) is None:
            value = _CURRENT.get()
            if value is not None:
                setattr(record, LOG_FIELD, value)
        return True


class RequestIdMiddleware:
    """Gives each HTTP request its id and sets ``X-Request-Id`` on the answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _incoming(scope)
        scope.setdefault("state", {})[_STATE_KEY] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id.value
            await send(message)

        token = _CURRENT.set(request_id.value)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _CURRENT.reset(token)
