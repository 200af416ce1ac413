"""``POST /v1/completions`` against a scripted backend: prompts, echo, logprobs, n, streams, errors.

The cases of NVIDIA's OpenAI-frontend ``test_completions.py`` that apply here are ported (with
this server's 400 where theirs answers 422); those that need a real model are in
tests/e2e/test_completions_e2e.py.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest
from frontend_fakes import (
    MODEL,
    PIECES,
    PROMPT_TOKENS,
    FakeBackend,
    backend_error,
    choice_deltas,
    client_for,
    fixed,
    interleave,
    settings,
)
from test_chat_stream import parse_sse
from test_request_errors import assert_envelope

from openai_frontend.app import create_app
from openai_frontend.client.base import BackendRequest
from python_backend.protocol.contract import ChoiceDelta

PROMPT = "What is machine learning?"
TEXT = "".join(PIECES)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, **fields}


def openai_client(backend: FakeBackend, **overrides: Any) -> openai.AsyncOpenAI:
    app = create_app(settings(**overrides), backend)
    http_client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://testserver/v1")
    return openai.AsyncOpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http_client, max_retries=0)


async def post(backend: FakeBackend, payload: dict[str, Any], **overrides: Any) -> Any:
    async with client_for(backend, **overrides) as client:
        return await client.post("/v1/completions", json=payload)


async def test_defaults_send_the_raw_prompt_and_answer_a_text_completion() -> None:
    backend = FakeBackend()
    response = await post(backend, body(), openai_mode="openai")
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "text_completion" and answer["id"].startswith("cmpl-")
    assert answer["model"] == MODEL
    assert answer["choices"] == [{"index": 0, "text": TEXT, "logprobs": None, "finish_reason": "stop"}]
    usage = answer["usage"]
    assert usage["prompt_tokens"] == PROMPT_TOKENS and usage["completion_tokens"] == len(PIECES)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    [request] = backend.requests
    assert request.prompt == PROMPT and request.stream is False
    # OpenAI's default max_tokens for this endpoint; the raw text is never parsed for reasoning.
    assert request.parameters == {"max_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}}


@pytest.mark.parametrize(
    ("field", "value", "wire"),
    [
        ("temperature", 0.7, {"temperature": 0.7}),
        ("max_tokens", 10, {"max_tokens": 10}),
        ("top_p", 0.9, {"top_p": 0.9}),
        ("frequency_penalty", 0.5, {"frequency_penalty": 0.5}),
        ("presence_penalty", 0.2, {"presence_penalty": 0.2}),
        ("n", 1, {}),
        ("logprobs", 5, {"logprobs": True, "top_logprobs": 5}),
        ("min_tokens", 16, {"min_tokens": 16}),
        ("ignore_eos", True, {"ignore_eos": True}),
        ("stop", ["\n\n", "END"], {"stop": ["\n\n", "END"]}),
        ("seed", 1, {"seed": 1}),
    ],
)
async def test_sampling_parameters_reach_the_backend(field: str, value: Any, wire: dict[str, Any]) -> None:
    backend = FakeBackend()
    response = await post(backend, body(**{field: value}))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == TEXT
    expected = {"max_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}, **wire}
    assert backend.requests[0].parameters == expected


async def test_default_max_tokens_never_falls_below_min_tokens() -> None:
    backend = FakeBackend()
    response = await post(backend, body(min_tokens=40))
    assert response.status_code == 200, response.text
    assert backend.requests[0].parameters["max_tokens"] == 40


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"top_p": 1.1}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"presence_penalty": 2.1}, "presence_penalty"),
        ({"presence_penalty": -2.1}, "presence_penalty"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"ignore_eos": 123}, "ignore_eos"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"n": 2, "best_of": 1, "temperature": 1}, "best_of"),
        ({"suffix": " and that is all."}, "suffix"),
        ({"echo": "yes"}, "echo"),
        ({"max_tokens": 0}, "max_tokens"),  # 0 only with echo
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["fine", ""]}, "prompt.1"),
        ({"prompt": ["fine", 3]}, "prompt.1"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt": [1, -2, 3]}, "prompt.1"),  # token ids are taken (test_completions_token_ids)
        ({"prompt": ["a"] * 65, "n": 2, "temperature": 1}, "n"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": "nope"}, "model"),
    ],
)
async def test_bad_field_is_400_naming_it(fields: dict[str, Any], param: str) -> None:
    backend = FakeBackend()
    response = await post(backend, body(**fields), openai_mode="openai")
    assert_envelope(response, 404 if param == "model" else 400, param)
    assert backend.requests == []


async def test_suffix_is_refused_by_name() -> None:
    response = await post(FakeBackend(), body(suffix="!"))
    assert "'suffix' is not supported" in assert_envelope(response, 400, "suffix")["message"]


@pytest.mark.parametrize("payload", [{}, {"prompt": PROMPT}, {"model": MODEL}])
async def test_missing_model_or_prompt(payload: dict[str, Any]) -> None:
    response = await post(FakeBackend(), payload)
    assert_envelope(response, 400, "model" if "model" not in payload else "prompt")


async def test_echo_puts_the_prompt_before_the_text() -> None:
    echoed = await post(FakeBackend(), body(echo=True))
    plain = await post(FakeBackend(), body(echo=False))
    assert echoed.json()["choices"][0]["text"] == PROMPT + TEXT
    assert plain.json()["choices"][0]["text"] == TEXT


async def test_logprobs_in_the_completions_form() -> None:
    response = await post(FakeBackend(), body(logprobs=2, max_tokens=10))
    logprobs = response.json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == PIECES
    assert logprobs["token_logprobs"] == [-0.25] * len(PIECES)
    assert logprobs["top_logprobs"] == [{piece: -0.25, "x": -2.0} for piece in PIECES]
    starts = [sum(len(p) for p in PIECES[:i]) for i in range(len(PIECES))]
    assert logprobs["text_offset"] == starts


async def test_logprobs_zero_returns_none() -> None:
    backend = FakeBackend()
    response = await post(backend, body(logprobs=0, max_tokens=10))
    assert response.json()["choices"][0]["logprobs"] is None
    assert "logprobs" not in backend.requests[0].parameters


def two_prompt_script(req: BackendRequest) -> list[ChoiceDelta | Any]:
    # Each prompt answers its own text, so the test sees which choice came from which prompt.
    n = int(req.parameters.get("n") or 1)
    assert req.prompt is not None
    return interleave(*(choice_deltas(k, [req.prompt.upper(), f" {k}"]) for k in range(n)))


async def test_several_prompts_times_n_choices_in_prompt_order() -> None:
    backend = FakeBackend(script=two_prompt_script)
    response = await post(backend, body(prompt=["ab", "cd"], n=2, temperature=1), openai_mode="openai")
    answer = response.json()
    assert [(c["index"], c["text"]) for c in answer["choices"]] == [(0, "AB 0"), (1, "AB 1"), (2, "CD 0"), (3, "CD 1")]
    assert sorted(r.prompt or "" for r in backend.requests) == ["ab", "cd"]
    assert len({r.request_id for r in backend.requests}) == 2
    assert answer["usage"]["prompt_tokens"] == 2 * PROMPT_TOKENS  # each prompt counts once
    assert answer["usage"]["completion_tokens"] == 4 * 2


async def test_mindie_mode_adds_the_telemetry_fields_as_chat_does() -> None:
    answer = (await post(FakeBackend(), body())).json()
    assert answer["usage"]["batch_size"] == [1] * len(PIECES)
    assert len(answer["usage"]["queue_wait_time"]) == len(PIECES)
    assert answer["prefill_time"] == 20.5 + len(PIECES)
    assert len(answer["decode_time_arr"]) == len(PIECES) - 1


async def test_stream_with_echo_logprobs_off_and_usage_chunk() -> None:
    backend = FakeBackend()
    response = await post(
        backend, body(stream=True, echo=True, stream_options={"include_usage": True}), openai_mode="openai"
    )
    chunks = parse_sse(response.text)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts[0] == PROMPT + PIECES[0] and "".join(texts) == PROMPT + TEXT
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(PIECES)
    assert backend.requests[0].stream is True


async def test_stream_logprobs_offsets_run_across_chunks() -> None:
    chunks = parse_sse((await post(FakeBackend(), body(stream=True, logprobs=1), openai_mode="openai")).text)
    offsets = [offset for c in chunks for offset in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [sum(len(p) for p in PIECES[:i]) for i in range(len(PIECES))]


async def test_mindie_stream_last_chunk_of_each_choice_carries_its_usage() -> None:
    chunks = parse_sse((await post(FakeBackend(), body(stream=True))).text)
    assert [("usage" in c) for c in chunks] == [False] * (len(PIECES) - 1) + [True]
    assert chunks[-1]["usage"]["batch_size"] == [1] * len(PIECES)


async def test_an_error_mid_stream_ends_it_with_the_error_event() -> None:
    script = fixed([*choice_deltas(0, PIECES)[:3], backend_error(500, "engine failed")])
    chunks = parse_sse((await post(FakeBackend(script=script), body(stream=True), openai_mode="openai")).text)
    assert chunks[-1] == {
        "error": {"message": "engine failed", "type": "invalid_request_error", "param": None, "code": None}
    }


async def test_one_failing_prompt_fails_the_request_and_cancels_the_other() -> None:
    def script(req: BackendRequest) -> list[ChoiceDelta | Any]:
        if req.prompt == "bad":
            return [backend_error(400, "prompt too long", "context_length_exceeded")]
        return choice_deltas(0, PIECES)

    backend = FakeBackend(script=script, delay_s=0.01)
    response = await post(backend, body(prompt=["good", "bad"]))
    assert assert_envelope(response, 400)["code"] == "context_length_exceeded"
    assert sorted(backend.endings) == ["cancelled", "error"]


async def test_the_openai_client_completions_create() -> None:
    async with openai_client(FakeBackend(), openai_mode="openai") as client:
        whole = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, logprobs=2)
        stream = await client.completions.create(
            model=MODEL, prompt=PROMPT, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    assert whole.object == "text_completion" and whole.choices[0].text == TEXT
    assert whole.choices[0].logprobs is not None and whole.choices[0].logprobs.tokens == PIECES
    assert whole.usage is not None and whole.usage.completion_tokens == len(PIECES)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == TEXT
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == PROMPT_TOKENS


async def test_the_openai_client_sees_a_400_for_suffix() -> None:
    async with openai_client(FakeBackend(), openai_mode="openai") as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model=MODEL, prompt=PROMPT, suffix="!")
    assert json.loads(caught.value.response.text)["error"]["param"] == "suffix"
