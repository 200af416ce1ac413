"""Plain OpenAI mode (``openai_mode != "vllm"``), driven by the official ``openai`` client."""

from __future__ import annotations

import json
from typing import Any

import httpx
import httpx2
import openai
import pytest
from frontend_fakes import (
    MODEL,
    PIECES,
    PROMPT_TOKENS,
    FakeBackend,
    backend_error,
    chat_body,
    choice_deltas,
    fixed,
    settings,
)
from openai.types.chat import ChatCompletionMessageParam

from openai_frontend.app import create_app

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]


def openai_client(backend: FakeBackend, **overrides: Any) -> openai.AsyncOpenAI:
    """The official client over an in-process transport (this openai release is built on httpx2)."""
    app = create_app(settings(**overrides), backend)
    http_client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://testserver/v1")
    return openai.AsyncOpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http_client, max_retries=0)


async def test_non_stream_with_openai_client() -> None:
    async with openai_client(FakeBackend(), openai_mode="openai") as client:
        completion = await client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, temperature=0.5)
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert [c.message.content for c in completion.choices] == ["".join(PIECES), "".join(PIECES[:-1])]
    assert completion.choices[0].message.tool_calls is None
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == PROMPT_TOKENS
    assert completion.usage.completion_tokens == 2 * len(PIECES) - 1
    assert completion.usage.total_tokens == PROMPT_TOKENS + 2 * len(PIECES) - 1
    extra = completion.model_dump()
    for mindie_only in ("prefill_time", "decode_time_arr"):
        assert mindie_only not in extra
    assert "batch_size" not in extra["usage"]


async def test_stream_role_chunk_then_content_then_usage_chunk() -> None:
    async with openai_client(FakeBackend(), openai_mode="openai") as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    first = chunks[0].choices[0]
    assert first.delta.role == "assistant" and first.delta.content == ""
    assert first.finish_reason is None
    content_chunks = [c for c in chunks[1:] if c.choices]
    assert all(c.choices[0].delta.role is None for c in content_chunks)
    assert "".join(c.choices[0].delta.content or "" for c in content_chunks) == "".join(PIECES)
    assert content_chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == len(PIECES)
    assert last.usage.total_tokens == PROMPT_TOKENS + len(PIECES)


async def test_stream_without_include_usage_has_no_usage() -> None:
    async with openai_client(FakeBackend(), openai_mode="openai") as client:
        stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(c.usage is None and c.choices for c in chunks)


async def test_stream_options_without_stream_is_400() -> None:
    async with openai_client(FakeBackend(), openai_mode="openai") as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream_options={"include_usage": True})
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == "stream_options"


async def test_mid_stream_error_is_an_error_event() -> None:
    script = fixed([*choice_deltas(0, ["a", "b"])[:1], backend_error(500, "engine failed")])
    app = create_app(settings(openai_mode="openai"), FakeBackend(script=script))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    events = [e for e in response.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: ") :])["error"]["message"] == "engine failed"
    async with openai_client(FakeBackend(script=script), openai_mode="openai") as client:
        stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIError):
            async for _ in stream:
                pass


async def test_mindie_mode_reports_stream_options_as_ignored() -> None:
    app = create_app(settings(), FakeBackend())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
        response = await client.post(
            "/v1/chat/completions", json=chat_body(stream=True, stream_options={"include_usage": True})
        )
    assert response.status_code == 200
    assert response.headers["x-ignored-params"] == "stream_options"


async def test_openai_client_also_reads_mindie_mode() -> None:
    """MindIE's extras (role in every delta, usage on choice chunks, timing fields) parse as extras."""
    async with openai_client(FakeBackend()) as client:
        completion = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert completion.choices[0].message.content == "".join(PIECES)
    assert completion.model_dump()["decode_time_arr"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "".join(PIECES)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(PIECES)
