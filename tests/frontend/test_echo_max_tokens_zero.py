"""``/v1/completions`` with ``echo`` and ``max_tokens: 0``: the prompt alone, as vLLM answers it.

vLLM's answer: the text is the prompt, ``finish_reason`` is ``length`` and ``completion_tokens``
is 0; with ``logprobs`` only the prompt's tokens are scored. The engine's contract has
``max_tokens`` >= 1, so the scripted backend answers as the engine does for the request it gets
(``max_tokens`` 1): one token, here an end-of-sequence one (``finish_reason`` ``stop``), with its
logprobs and usage. None of it may reach the client.
"""

from __future__ import annotations

from typing import Any

import pytest
from frontend_fakes import MODEL, PROMPT_TOKENS, FakeBackend, choice_deltas, client_for
from test_chat_stream import parse_sse
from test_prompt_logprobs_api import PROMPT, SCORED
from test_prompt_logprobs_api import PROMPT_TOKENS as PROMPT_PIECES

from openai_frontend.client.base import BackendRequest
from python_backend.protocol.contract import ChoiceDelta

GENERATED = "</s>"


def one_token_script(req: BackendRequest) -> list[ChoiceDelta | Any]:
    """The engine's answer to ``max_tokens`` 1: one token, the prompt's scores on its delta."""
    assert req.parameters["max_tokens"] == 1
    n = int(req.parameters.get("n") or 1)
    deltas = [choice_deltas(k, [GENERATED], with_logprobs=True)[0] for k in range(n)]
    if req.parameters.get("prompt_logprobs") is not None:
        deltas[0].prompt_logprobs = SCORED
    return deltas


async def post(payload: dict[str, Any], mode: str) -> Any:
    async with client_for(FakeBackend(script=one_token_script), openai_mode=mode) as client:
        return await client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, **payload})


@pytest.mark.parametrize("mode", ["openai", "vllm"])
async def test_the_answer_is_the_prompt_with_nothing_generated_or_counted(mode: str) -> None:
    response = await post({"echo": True, "max_tokens": 0, "logprobs": 1}, mode)
    assert response.status_code == 200, response.text
    answer = response.json()
    [choice] = answer["choices"]
    assert choice["text"] == PROMPT
    assert choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == PROMPT_PIECES
    assert choice["logprobs"]["token_logprobs"] == [None, -1.5, -9999.0]
    usage = answer["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        PROMPT_TOKENS,
        0,
        PROMPT_TOKENS,
    )
    if mode == "vllm":  # MindIE's per-token arrays: as long as the (no) generated tokens
        assert (usage["batch_size"], usage["queue_wait_time"], answer["decode_time_arr"]) == ([], [], [])
        assert answer["prefill_time"] > 0


async def test_several_choices_each_count_nothing() -> None:
    response = await post({"echo": True, "max_tokens": 0, "n": 2, "temperature": 1}, "openai")
    answer = response.json()
    assert [(c["text"], c["finish_reason"]) for c in answer["choices"]] == [(PROMPT, "length")] * 2
    assert answer["usage"]["completion_tokens"] == 0


async def test_a_stream_sends_the_prompt_and_a_zero_usage() -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    payload = {"echo": True, "max_tokens": 0, "logprobs": 1, "stream": True, "stream_options": options}
    chunks = parse_sse((await post(payload, "openai")).text)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(c["text"] for c in choices) == PROMPT
    assert [t for c in choices for t in c["logprobs"]["tokens"]] == PROMPT_PIECES
    assert choices[-1]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert [c["usage"]["completion_tokens"] for c in chunks] == [0] * len(chunks)
    assert chunks[-1]["usage"]["total_tokens"] == PROMPT_TOKENS


async def test_a_mindie_stream_ends_with_length_and_a_zero_usage() -> None:
    chunks = parse_sse((await post({"echo": True, "max_tokens": 0, "stream": True}, "vllm")).text)
    assert "".join(c["choices"][0]["text"] for c in chunks) == PROMPT
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 0 and last["usage"]["batch_size"] == []
