"""A client that goes away cancels its backend request (streaming and non-streaming).

httpx's ASGI transport cannot disconnect mid-response, so these tests drive the ASGI app directly
with a ``receive`` that reports ``http.disconnect`` when the test decides.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from frontend_fakes import FakeBackend, chat_body, settings
from starlette.types import ASGIApp, Message

from openai_frontend.app import create_app


class AsgiCall:
    """One request to an ASGI app; the test sets ``disconnect`` to make the client leave."""

    def __init__(self, body: dict[str, Any], spec_version: str) -> None:
        raw = json.dumps(body).encode()
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": spec_version},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }
        self._body = raw
        self._body_sent = False
        self.disconnect = asyncio.Event()
        self.sent: list[Message] = []
        self.first_body = asyncio.Event()

    async def receive(self) -> Message:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.disconnect.is_set() and message["type"] == "http.response.body":
            raise OSError("client gone")  # what ASGI 2.4 servers do after a disconnect
        self.sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            self.first_body.set()

    def body_text(self) -> str:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body").decode()


async def leave_mid_stream(app: ASGIApp, spec_version: str = "2.4") -> AsgiCall:
    """A streaming request whose client goes away after the first bytes; returns once it is over."""
    call = AsgiCall(chat_body(stream=True), spec_version)
    task = asyncio.ensure_future(app(call.scope, call.receive, call.send))
    await asyncio.wait_for(call.first_body.wait(), 5)
    call.disconnect.set()
    await asyncio.wait_for(task, 5)
    return call


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_stream_disconnect_closes_backend_stream(spec_version: str) -> None:
    backend = FakeBackend(delay_s=0.05)
    call = await leave_mid_stream(create_app(settings(), backend), spec_version)
    await asyncio.wait_for(backend.ended.wait(), 5)
    assert backend.endings in (["cancelled"], ["closed"])
    assert "[DONE]" not in call.body_text()


async def test_disconnect_before_first_token_cancels_stream_request() -> None:
    backend = FakeBackend(delay_s=0.5)
    app = create_app(settings(), backend)
    call = AsgiCall(chat_body(stream=True), "2.4")
    task = asyncio.create_task(app(call.scope, call.receive, call.send))
    await asyncio.wait_for(backend.started.wait(), 5)
    call.disconnect.set()
    await asyncio.wait_for(task, 5)
    assert backend.endings in (["cancelled"], ["closed"])
    assert call.sent[0]["status"] == 499


async def test_non_stream_disconnect_cancels_backend_request() -> None:
    backend = FakeBackend(delay_s=0.05)
    app = create_app(settings(), backend)
    call = AsgiCall(chat_body(), "2.4")
    task = asyncio.create_task(app(call.scope, call.receive, call.send))
    await asyncio.wait_for(backend.started.wait(), 5)
    await asyncio.sleep(0.06)  # a token or two in
    call.disconnect.set()
    await asyncio.wait_for(task, 5)
    assert backend.endings in (["cancelled"], ["closed"])
    assert call.sent[0]["status"] == 499


async def test_completed_stream_is_not_cancelled() -> None:
    backend = FakeBackend()
    app = create_app(settings(), backend)
    call = AsgiCall(chat_body(stream=True), "2.4")
    await asyncio.wait_for(app(call.scope, call.receive, call.send), 5)
    assert backend.endings == ["finished"]
    assert call.body_text().endswith("data: [DONE]\n\n")
