"""Per-token and end-to-end timeouts (MindIE ``tokenTimeout``/``e2eTimeout``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

import grpc
from frontend_fakes import PIECES, FakeBackend, chat_body, client_for
from test_chat_stream import parse_sse

from openai_frontend.chat.serving import paced
from openai_frontend.client.base import BackendError
from openai_frontend.client.own_stream import rpc_error as _rpc_error
from python_backend.protocol.contract import ChoiceDelta

TOKEN_TIMEOUT_S = 0.3
STALL_S = 30.0  # far beyond the timeout: only the timeout can end the request in time


async def test_a_stream_that_stalls_ends_with_the_timeout_event_and_is_cancelled() -> None:
    backend = FakeBackend(pauses={2: STALL_S})  # two tokens, then nothing
    started = time.monotonic()
    async with client_for(backend, token_timeout_s=TOKEN_TIMEOUT_S) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    chunks = parse_sse(response.text)
    assert [c["choices"][0]["delta"]["content"] for c in chunks[:2]] == PIECES[:2]
    assert chunks[-1]["err_msg"] == f"the model sent nothing within the token timeout ({TOKEN_TIMEOUT_S:g} s)"
    assert elapsed < TOKEN_TIMEOUT_S + 1.0  # within timeout + 1 s
    assert backend.endings == ["cancelled"]  # the backend call was cancelled, not left running


async def test_openai_mode_stream_timeout_is_an_error_event_with_its_code() -> None:
    backend = FakeBackend(pauses={1: STALL_S})
    async with client_for(backend, token_timeout_s=TOKEN_TIMEOUT_S, openai_mode="openai") as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    chunks = parse_sse(response.text)
    error = chunks[-1]["error"]
    assert error["code"] == "token_timeout" and error["type"] == "timeout"
    assert backend.endings == ["cancelled"]


async def test_no_first_token_within_the_timeout_is_a_504_before_any_byte() -> None:
    backend = FakeBackend(pauses={0: STALL_S})  # e.g. stuck in the queue
    async with client_for(backend, token_timeout_s=TOKEN_TIMEOUT_S) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "token_timeout"
    assert backend.endings == ["cancelled"]


async def test_a_stream_slower_than_the_timeout_in_all_but_not_per_token_finishes() -> None:
    # Each response comes within the timeout, the whole stream takes longer than it.
    backend = FakeBackend(delay_s=TOKEN_TIMEOUT_S / 3)
    async with client_for(backend, token_timeout_s=TOKEN_TIMEOUT_S) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    chunks = parse_sse(response.text)
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == "".join(PIECES)
    assert backend.endings == ["finished"]


async def test_a_non_streaming_answer_is_not_held_to_the_token_timeout() -> None:
    # It arrives whole, so the wait is the whole answer's: only the end-to-end timeout bounds it.
    backend = FakeBackend(pauses={0: TOKEN_TIMEOUT_S * 2})
    async with client_for(backend, token_timeout_s=TOKEN_TIMEOUT_S) as client:
        response = await client.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "".join(PIECES)


async def test_paced_closes_the_backend_stream_when_closed_early() -> None:
    closed = asyncio.Event()

    async def backend_stream() -> AsyncGenerator[ChoiceDelta, None]:
        try:
            while True:
                yield ChoiceDelta(0, text="x")
        finally:
            closed.set()

    stream = paced(backend_stream(), 5.0)
    assert (await anext(stream)).text == "x"
    await stream.aclose()
    assert closed.is_set()


class _DeadlineExceeded(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata())


def test_the_grpc_deadline_is_the_end_to_end_timeout_with_its_seconds() -> None:
    error = _rpc_error(_DeadlineExceeded(), 2.5)
    assert isinstance(error, BackendError)
    assert error.info.status == 504 and error.info.code == "timeout"
    assert error.info.message == "the request did not finish within the end-to-end timeout (2.5 s)"
