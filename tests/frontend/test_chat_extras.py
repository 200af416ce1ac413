"""logit_bias, min_p, the turn switches, echo, continuous usage and the fields we refuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from frontend_fakes import MODEL, PIECES, PROMPT_TOKENS, FakeBackend, chat_body, client_for

from openai_frontend.chat.schemas import UNSUPPORTED_FIELDS
from openai_frontend.client.base import BackendRequest
from openai_frontend.client.triton import build_infer_inputs
from python_backend.protocol import contract

PREFILL = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
MODES = ["vllm", "openai"]


def events_of(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE answer (``[DONE]`` checked and left out)."""
    events = [e for e in response.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


def content_of(chunks: list[dict[str, Any]], index: int = 0) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if c["choices"] and c["choices"][0]["index"] == index
    )


@pytest.mark.parametrize("mode", MODES)
async def test_extras_reach_the_backend_in_canonical_form(mode: str) -> None:
    backend = FakeBackend()
    fields = {
        "logit_bias": {"42": 100, "7": -5.5},
        "min_p": 0.1,
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    async with client_for(backend, openai_mode=mode) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(messages=PREFILL, **fields))
    assert response.status_code == 200 and "x-ignored-params" not in response.headers
    assert backend.requests[0].parameters == {**fields, "logit_bias": {"7": -5.5, "42": 100.0}}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": [5]}, "logit_bias"),
        ({"min_p": 2}, "min_p"),
        ({"continue_final_message": True}, "continue_final_message"),  # add_generation_prompt defaults to true
        ({"echo": "yes"}, "echo"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"priority": 5}, "priority"),
        ({"guided_json": {"type": "object"}}, "guided_json"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ],
)
async def test_bad_or_unimplemented_values_are_400_naming_the_field(
    mode: str, fields: dict[str, Any], param: str
) -> None:
    backend = FakeBackend()
    async with client_for(backend, openai_mode=mode) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(**fields))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]
    assert backend.requests == []


async def test_known_fields_with_their_neutral_values_pass_and_unknown_ones_are_reported() -> None:
    neutral = {"priority": 0, "prompt_logprobs": None, "length_penalty": 1, "modalities": ["text"], "echo": False}
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(frobnicate=1, **neutral))
    assert response.status_code == 200
    assert response.headers["x-ignored-params"] == "frobnicate"
    assert backend.requests[0].parameters == {}


@pytest.mark.parametrize("mode", MODES)
async def test_echo_prepends_the_final_assistant_message(mode: str) -> None:
    async with client_for(FakeBackend(), openai_mode=mode) as client:
        whole = await client.post("/v1/chat/completions", json=chat_body(messages=PREFILL, echo=True, n=2))
        streamed = await client.post(
            "/v1/chat/completions", json=chat_body(messages=PREFILL, echo=True, n=2, stream=True)
        )
        user_last = await client.post("/v1/chat/completions", json=chat_body(echo=True))
    choices = whole.json()["choices"]
    assert [c["message"]["content"] for c in choices] == [
        "The colour is" + "".join(PIECES),
        "The colour is" + "".join(PIECES[:-1]),
    ]
    chunks = events_of(streamed)
    assert content_of(chunks, 0) == "The colour is" + "".join(PIECES)
    assert content_of(chunks, 1) == "The colour is" + "".join(PIECES[:-1])
    assert user_last.json()["choices"][0]["message"]["content"] == "".join(PIECES)  # nothing to echo


async def test_full_text_includes_the_echo() -> None:
    async with client_for(FakeBackend(), full_text_enabled=True) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(messages=PREFILL, echo=True, stream=True))
    assert events_of(response)[-1]["full_text"] == "The colour is" + "".join(PIECES)


async def test_continuous_usage_stats_puts_running_usage_on_every_chunk() -> None:
    backend = FakeBackend()
    options = {"include_usage": True, "continuous_usage_stats": True}
    async with client_for(backend, openai_mode="openai") as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True, stream_options=options))
    assert response.status_code == 200
    assert backend.requests[0].counts_every_response
    chunks = events_of(response)
    usages = [
        (c["usage"]["prompt_tokens"], c["usage"]["completion_tokens"], c["usage"]["total_tokens"]) for c in chunks
    ]
    expected = [(PROMPT_TOKENS, k, PROMPT_TOKENS + k) for k in range(len(PIECES) + 1)]
    assert usages == [*expected, expected[-1]]  # the role chunk, one per token, the final usage chunk
    assert chunks[-1]["choices"] == []


@pytest.mark.parametrize(
    "options", [{"include_usage": True, "continuous_usage_stats": False}, {"continuous_usage_stats": True}]
)
async def test_continuous_usage_off_or_without_include_usage_changes_nothing(options: dict[str, bool]) -> None:
    backend = FakeBackend()
    async with client_for(backend, openai_mode="openai") as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True, stream_options=options))
    assert response.status_code == 200
    chunks = events_of(response)
    with_usage = [c for c in chunks if "usage" in c]
    assert with_usage == ([chunks[-1]] if options.get("include_usage") else [])
    assert not backend.requests[0].counts_every_response


def test_counts_every_response_asks_the_model_for_the_counts() -> None:
    request = BackendRequest("r", [{"role": "user", "content": "Hi"}], {}, counts_every_response=True)
    names = [t.name() for t in build_infer_inputs(request)]
    assert contract.RETURN_NUM_INPUT_TOKENS in names and contract.RETURN_NUM_OUTPUT_TOKENS in names
    assert contract.RETURN_NUM_INPUT_TOKENS not in [t.name() for t in build_infer_inputs(BackendRequest("r", [], {}))]


def test_docs_list_every_refused_field() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    paragraph = docs.split("**Known fields this server does not implement**")[1].split("\n\n")[0]
    assert sorted(name for name in UNSUPPORTED_FIELDS if f"`{name}`" not in paragraph) == []


async def test_completions_stream_running_usage_with_continuous_usage_stats() -> None:
    backend = FakeBackend()
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": MODEL, "prompt": "Once upon", "stream": True, "stream_options": options}
    async with client_for(backend, openai_mode="openai") as client:
        response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200
    assert backend.requests[0].counts_every_response
    chunks = events_of(response)
    assert all("usage" in c for c in chunks)
    running = [c["usage"]["completion_tokens"] for c in chunks[:-1]]
    assert running == sorted(running) and running[-1] == len(PIECES)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == PROMPT_TOKENS
