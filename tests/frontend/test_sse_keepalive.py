"""SSE keep-alive comments while a stream waits for its first token (``--sse-keepalive``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from frontend_fakes import PIECES, FakeBackend, backend_error, chat_body, client_for, fixed, settings

from openai_frontend.chat.serving import ChatCall, keepalive_events
from openai_frontend.chat.sse import DONE_EVENT, KEEPALIVE_EVENT
from openai_frontend.chat.validation import validate_chat_request
from openai_frontend.client.base import BackendRequest
from openai_frontend.http.metrics import FrontendMetrics
from python_backend.protocol.contract import ChoiceDelta

INTERVAL_S = 0.02
WAIT_S = 10.0  # a bound on each wait, so a missing comment fails instead of hanging


@dataclass
class GatedBackend(FakeBackend):
    """Holds every stream before its first delta until ``gate`` is set (a request in the queue)."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)

    def generate(self, req: BackendRequest) -> AsyncGenerator[ChoiceDelta, None]:
        return self._gated(req)

    async def _gated(self, req: BackendRequest) -> AsyncGenerator[ChoiceDelta, None]:
        self.started.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.endings.append("cancelled while waiting")
            self.ended.set()
            raise
        inner = self._generate(req)
        try:
            async for delta in inner:
                yield delta
        finally:
            await inner.aclose()


def _call(**overrides: object) -> ChatCall:
    frontend = settings(sse_keepalive_s=INTERVAL_S, **overrides)
    chat = validate_chat_request(json.dumps(chat_body(stream=True)).encode(), frontend)
    return ChatCall(chat, frontend, FrontendMetrics(frontend.served_model_name).observe(time.monotonic()))


def _data(events: list[bytes]) -> list[dict]:
    return [json.loads(e[len(b"data: ") :]) for e in events if e.startswith(b"data: {")]


async def test_comments_flow_while_the_request_waits_then_the_stream_is_unchanged() -> None:
    backend = GatedBackend()
    stream = keepalive_events(backend, _call(), INTERVAL_S)
    first = await asyncio.wait_for(anext(stream), WAIT_S)
    second = await asyncio.wait_for(anext(stream), WAIT_S)
    assert first == second == KEEPALIVE_EVENT  # nothing could be sent but comments: the gate is shut
    backend.gate.set()
    rest = [event async for event in stream]
    tokens = [e for e in rest if e != KEEPALIVE_EVENT]
    assert tokens[-1] == DONE_EVENT
    chunks = _data(tokens)
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == PIECES
    assert backend.endings == ["finished"]


async def test_an_error_before_the_first_token_ends_the_stream_with_the_error_event() -> None:
    backend = GatedBackend(script=fixed([backend_error(429, "the queue is full", "overloaded")]))
    stream = keepalive_events(backend, _call(openai_mode="openai"), INTERVAL_S)
    assert await asyncio.wait_for(anext(stream), WAIT_S) == KEEPALIVE_EVENT
    backend.gate.set()
    rest = [event async for event in stream if event != KEEPALIVE_EVENT]
    assert rest[-1] == DONE_EVENT
    assert _data(rest) == [
        {
            "error": {
                "message": "the queue is full",
                "type": "invalid_request_error",
                "param": None,
                "code": "overloaded",
            }
        }
    ]


async def test_a_client_that_leaves_while_waiting_cancels_the_backend_stream() -> None:
    backend = GatedBackend()
    stream = keepalive_events(backend, _call(), INTERVAL_S)
    assert await asyncio.wait_for(anext(stream), WAIT_S) == KEEPALIVE_EVENT
    await backend.started.wait()
    await stream.aclose()
    await backend.ended.wait()
    assert backend.endings == ["cancelled while waiting"]


async def test_through_the_app_a_stream_with_keepalive_has_the_same_events() -> None:
    async with client_for(FakeBackend(), sse_keepalive_s=INTERVAL_S) as client:
        kept = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    async with client_for(FakeBackend()) as client:
        plain = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert kept.status_code == plain.status_code == 200
    assert kept.headers["content-type"].startswith("text/event-stream")

    def contents(text: str) -> list[str]:
        events = [e for e in text.split("\n\n") if e and not e.startswith(":")]
        return [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events if e != "data: [DONE]"]

    assert contents(kept.text) == contents(plain.text) == PIECES


async def test_with_keepalive_an_early_backend_error_is_a_200_stream_with_the_error() -> None:
    backend = FakeBackend(script=fixed([backend_error(429, "the queue is full", "overloaded")]))
    async with client_for(backend, sse_keepalive_s=INTERVAL_S) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    assert '"err_msg":"the queue is full"' in response.text and response.text.endswith("data: [DONE]\n\n")
