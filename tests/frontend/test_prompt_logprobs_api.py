"""``prompt_logprobs`` and completions' ``echo`` with ``logprobs``, against a scripted backend.

The backend's first delta carries the prompt's scores (as the engine sends them); the tests check
vLLM's response shapes: chat's top-level ``prompt_logprobs``, each completion choice's, and the
completions ``logprobs`` that start with the echoed prompt's tokens (the first one null).
"""

from __future__ import annotations

import math
from typing import Any

from frontend_fakes import MODEL, PIECES, FakeBackend, chat_body, client_for, default_script
from test_chat_stream import parse_sse

from openai_frontend.client.base import BackendRequest
from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.prompt_logprobs import PromptCandidate, PromptPosition

PROMPT = "Hello world"
TEXT = "".join(PIECES)
SCORED = [
    PromptPosition(11, "Hello"),
    PromptPosition(42, " wor", -1.5, 3, (PromptCandidate(7, -0.25, 1, " a"), PromptCandidate(9, -1.0, 2, "你"))),
    PromptPosition(5, "ld", -math.inf, 9000, (PromptCandidate(5, -math.inf, 1, "ld"),)),
]
VLLM_FORM = [
    None,
    {
        "42": {"logprob": -1.5, "rank": 3, "decoded_token": " wor"},
        "7": {"logprob": -0.25, "rank": 1, "decoded_token": " a"},
        "9": {"logprob": -1.0, "rank": 2, "decoded_token": "你"},
    },
    {"5": {"logprob": -9999.0, "rank": 9000, "decoded_token": "ld"}},
]
PROMPT_TOKENS = ["Hello", " wor", "ld"]


def scoring_script(req: BackendRequest) -> list[ChoiceDelta | Any]:
    """The default answer, its first delta carrying the prompt's scores when they were asked for."""
    deltas = default_script(req)
    if req.parameters.get("prompt_logprobs") is not None:
        first = deltas[0]
        assert isinstance(first, ChoiceDelta)
        first.prompt_logprobs = SCORED
    return deltas


async def post(path: str, payload: dict[str, Any]) -> tuple[Any, FakeBackend]:
    backend = FakeBackend(script=scoring_script)
    async with client_for(backend, openai_mode="openai") as client:
        return await client.post(path, json=payload), backend


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, **fields}


async def test_chat_answers_them_at_the_top_level_in_vllms_form() -> None:
    response, backend = await post("/v1/chat/completions", chat_body(prompt_logprobs=2))
    assert response.status_code == 200, response.text
    assert backend.requests[0].parameters == {"prompt_logprobs": 2}
    answer = response.json()
    assert answer["prompt_logprobs"] == VLLM_FORM
    assert "prompt_logprobs" not in answer["choices"][0]
    plain, _ = await post("/v1/chat/completions", chat_body())
    assert "prompt_logprobs" not in plain.json()


async def test_chat_refuses_them_when_streaming_unless_zero() -> None:
    response, backend = await post("/v1/chat/completions", chat_body(prompt_logprobs=1, stream=True))
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt_logprobs"
    assert backend.requests == []
    zero, _ = await post("/v1/chat/completions", chat_body(prompt_logprobs=0, stream=True))
    assert zero.status_code == 200


async def test_echo_with_logprobs_scores_the_prompt_tokens_first() -> None:
    response, backend = await post("/v1/completions", completion(echo=True, logprobs=1, max_tokens=1))
    assert response.status_code == 200, response.text
    parameters = backend.requests[0].parameters
    assert (parameters["prompt_logprobs"], parameters["top_logprobs"], parameters["max_tokens"]) == (1, 1, 1)
    [choice] = response.json()["choices"]
    assert choice["text"] == PROMPT + TEXT
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == PROMPT_TOKENS + PIECES
    assert logprobs["token_logprobs"] == [None, -1.5, -9999.0] + [-0.25] * len(PIECES)
    assert logprobs["top_logprobs"][:3] == [None, {" wor": -1.5, " a": -0.25, "你": -1.0}, {"ld": -9999.0}]
    tokens = PROMPT_TOKENS + PIECES
    assert logprobs["text_offset"] == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert choice["prompt_logprobs"] == VLLM_FORM


async def test_echo_with_max_tokens_zero_answers_the_prompt_alone() -> None:
    response, backend = await post("/v1/completions", completion(echo=True, logprobs=1, max_tokens=0))
    assert response.status_code == 200, response.text
    assert backend.requests[0].parameters["max_tokens"] == 1
    [choice] = response.json()["choices"]
    assert choice["text"] == PROMPT
    assert choice["logprobs"]["tokens"] == PROMPT_TOKENS
    assert choice["logprobs"]["token_logprobs"] == [None, -1.5, -9999.0]


async def test_prompt_logprobs_without_echo_leave_the_text_and_logprobs_alone() -> None:
    response, _ = await post("/v1/completions", completion(prompt_logprobs=2))
    [choice] = response.json()["choices"]
    assert choice["text"] == TEXT and choice["logprobs"] is None
    assert choice["prompt_logprobs"] == VLLM_FORM


async def test_a_stream_echoes_the_scored_prompt_in_its_first_chunk() -> None:
    response, backend = await post("/v1/completions", completion(echo=True, logprobs=1, stream=True))
    assert response.status_code == 200, response.text
    assert backend.requests[0].parameters["prompt_logprobs"] == 1
    chunks = [c["choices"][0] for c in parse_sse(response.text) if c["choices"]]
    assert chunks[0]["text"] == PROMPT + PIECES[0]
    assert chunks[0]["logprobs"]["tokens"] == [*PROMPT_TOKENS, PIECES[0]]
    assert chunks[0]["logprobs"]["token_logprobs"][:2] == [None, -1.5]
    offsets = [offset for c in chunks for offset in c["logprobs"]["text_offset"]]
    tokens = PROMPT_TOKENS + PIECES
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


async def test_a_stream_with_max_tokens_zero_sends_the_prompt_alone() -> None:
    response, _ = await post("/v1/completions", completion(echo=True, max_tokens=0, stream=True))
    chunks = [c["choices"][0] for c in parse_sse(response.text) if c["choices"]]
    assert "".join(c["text"] for c in chunks) == PROMPT
