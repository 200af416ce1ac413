"""Graceful drain: new work refused with 503, work in flight finished, then stop."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import uvicorn
from frontend_fakes import FakeBackend, chat_body, choice_deltas, fixed, settings

from openai_frontend.app import create_app
from openai_frontend.http.drain import EXPIRY_GRACE_S, DrainState
from openai_frontend.launcher.draining_server import DrainingServer


async def test_drain_refuses_new_work_and_lets_the_stream_in_flight_finish() -> None:
    backend = FakeBackend(delay_s=0.05)  # a stream that is still running when the drain begins
    app = create_app(settings(), backend)
    drain = app.state.frontend.drain
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        assert (await client.get("/health/ready")).status_code == 200
        streaming = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body(stream=True)))
        await asyncio.wait_for(backend.started.wait(), 5)
        assert drain.in_flight == 1

        drain.begin(30)
        ready = await client.get("/health/ready")
        refused = await client.post("/v1/chat/completions", json=chat_body())
        assert not drain.done()  # the stream is still running
        reply = await asyncio.wait_for(streaming, 10)

        assert (await client.get("/health")).status_code == 200  # liveness is not readiness
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "server_draining"
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "server_draining"
    assert len(backend.requests) == 1  # the refused request never reached the model
    assert reply.status_code == 200 and reply.text.rstrip().endswith("data: [DONE]")
    assert backend.endings == ["finished"]
    assert drain.in_flight == 0 and drain.done()


async def test_tokenize_and_detokenize_are_refused_while_draining_as_chat_is() -> None:
    backend = FakeBackend()
    app = create_app(settings(), backend)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        served = await client.post("/tokenize", json={"prompt": "Hi"})
        app.state.frontend.drain.begin(30)
        chat = await client.post("/v1/chat/completions", json=chat_body())
        tokenize = await client.post("/tokenize", json={"prompt": "Hi"})
        detokenize = await client.post("/detokenize", json={"tokens": [72, 105]})
    assert served.status_code == 200
    assert chat.status_code == 503
    for refused in (tokenize, detokenize):
        assert (refused.status_code, refused.headers["retry-after"]) == (503, chat.headers["retry-after"])
        assert refused.json() == chat.json()
    assert len(backend.queries) == 1  # only the one before the drain reached the model


def test_drain_is_done_at_its_deadline_even_with_requests_in_flight() -> None:
    drain = DrainState()
    assert not drain.done()  # not draining at all
    drain.in_flight = 2
    drain.begin(3600)
    assert not drain.done() and not drain.expired()
    drain.deadline = time.monotonic() - 0.5  # the time is up: open streams end now
    assert drain.expired() and not drain.done()  # ... and get a moment to send their last event
    drain.deadline = time.monotonic() - EXPIRY_GRACE_S
    assert drain.done()


def _server(timeout_s: float) -> tuple[DrainingServer, DrainState]:
    drain = DrainState()
    return DrainingServer(uvicorn.Config(create_app(settings(), FakeBackend())), drain, timeout_s), drain


async def test_sigterm_drains_then_stops_and_a_second_signal_stops_at_once() -> None:
    server, drain = _server(30)
    drain.in_flight = 1
    server.handle_exit(signal.SIGTERM, None)
    assert drain.draining and not server.should_exit
    assert await server.on_tick(1) is False  # a request is still in flight
    drain.in_flight = 0
    assert await server.on_tick(1) is True and server.should_exit

    server, drain = _server(30)
    server.handle_exit(signal.SIGTERM, None)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit


def test_sigint_or_a_zero_drain_timeout_stops_at_once() -> None:
    server, drain = _server(30)
    server.handle_exit(signal.SIGINT, None)
    assert server.should_exit and not drain.draining
    server, drain = _server(0)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and not drain.draining


async def test_a_stream_open_at_the_drain_deadline_ends_with_an_error_event() -> None:
    pieces = [f" w{i}" for i in range(200)]
    backend = FakeBackend(script=fixed(choice_deltas(0, pieces)), delay_s=0.01)  # about 2 s of stream
    app = create_app(settings(), backend)
    drain = app.state.frontend.drain
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        streaming = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body(stream=True)))
        await asyncio.wait_for(backend.started.wait(), 5)
        drain.begin(0.2)
        reply = await asyncio.wait_for(streaming, 10)
    data = [line.removeprefix("data: ") for line in reply.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    last = json.loads(data[-2])
    assert last["err_msg"] == "server is shutting down" and last["choices"][0]["finish_reason"] == "stop"
    assert 1 < len(data) < len(pieces)  # cut short, after some of the answer
    assert backend.endings == ["closed"]  # the backend request was ended (Triton cancels it)
    assert drain.in_flight == 0 and drain.done()
