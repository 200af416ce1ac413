"""Prompt log-probabilities end to end: real tritonserver + frontend, with the openai client.

lm-evaluation-harness's log-likelihood request (``echo=True, logprobs=1, max_tokens=1``) must read
the prompt tokens' log-probabilities in ``token_logprobs`` (the first null), equal to a plain
transformers forward of the same token ids; chat's vLLM ``prompt_logprobs`` must say the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import torch
from transformers import AutoModelForCausalLM

from tests.e2e.conftest import TritonHandle
from tests.e2e.test_chat_e2e import client_for

PROMPT = "What is machine learning? It is a way"


def server_tokens(frontend_url: str, model: str, **query: Any) -> list[int]:
    response = httpx.post(f"{frontend_url}/tokenize", json={"model": model, **query}, timeout=60)
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


def reference_logprobs(model_dir: Path, ids: list[int]) -> list[float]:
    """log P(ids[i] | ids[:i]) for i >= 1 from a plain float32 forward."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    return [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]


def test_echo_logprobs_give_the_prompt_tokens_logprobs(
    triton_server: TritonHandle, frontend_url: str, tiny_model_dir: Path
) -> None:
    model = triton_server.served_model_name
    ids = server_tokens(frontend_url, model, prompt=PROMPT)
    answer = client_for(frontend_url).completions.create(
        model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    [choice] = answer.choices
    assert choice.text.startswith(PROMPT) and choice.logprobs is not None
    values = choice.logprobs.token_logprobs or []
    assert answer.usage is not None and len(values) == len(ids) + 1 == answer.usage.prompt_tokens + 1
    assert values[0] is None
    expected = reference_logprobs(tiny_model_dir, ids)
    assert max(abs(got - want) for got, want in zip(values[1 : len(ids)], expected, strict=True)) < 1e-3
    # Prompt only (max_tokens 0): the same prompt scores, nothing generated shown.
    only = client_for(frontend_url).completions.create(model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0)
    assert only.choices[0].text == PROMPT
    assert only.choices[0].logprobs is not None
    again = only.choices[0].logprobs.token_logprobs or []
    assert len(again) == len(ids) and again[0] is None
    assert max(abs(a - b) for a, b in zip(again[1:], values[1 : len(ids)], strict=True)) < 1e-5


def test_chat_prompt_logprobs_in_vllms_form(triton_server: TritonHandle, frontend_url: str) -> None:
    model = triton_server.served_model_name
    messages: list[Any] = [{"role": "user", "content": "What is machine learning?"}]
    ids = server_tokens(frontend_url, model, messages=messages)
    client = client_for(frontend_url)
    first, again = (  # the second must not be served from the prefix cache
        client.chat.completions.create(model=model, messages=messages, max_tokens=2, extra_body={"prompt_logprobs": 2})
        for _ in range(2)
    )
    scored = (first.model_extra or {})["prompt_logprobs"]
    assert scored == (again.model_extra or {})["prompt_logprobs"]
    assert len(scored) == len(ids) and scored[0] is None
    for token_id, entry in zip(ids[1:], scored[1:], strict=True):
        assert str(token_id) == next(iter(entry))  # the prompt's own token comes first
        assert 2 <= len(entry) <= 3 and all(v["logprob"] <= 0 and v["rank"] >= 1 for v in entry.values())
        assert {v["rank"] for v in entry.values()} >= {1, 2}


def test_a_stream_brings_the_same_prompt_scores_in_its_first_chunk(
    triton_server: TritonHandle, frontend_url: str
) -> None:
    # Streams go through a response channel: the scores ride on its first entry for the request.
    model, client = triton_server.served_model_name, client_for(frontend_url)
    args: dict[str, Any] = {"model": model, "prompt": PROMPT, "echo": True, "logprobs": 1, "temperature": 0}
    whole = client.completions.create(**args, max_tokens=2)
    chunks = [c.choices[0] for c in client.completions.create(**args, max_tokens=2, stream=True) if c.choices]
    assert chunks[0].text.startswith(PROMPT)
    assert "".join(c.text for c in chunks) == whole.choices[0].text
    streamed = [v for c in chunks for v in (c.logprobs.token_logprobs or []) if c.logprobs is not None]
    expected = whole.choices[0].logprobs.token_logprobs if whole.choices[0].logprobs is not None else None
    assert expected is not None and streamed[0] is None and len(streamed) == len(expected)
    assert max(abs(a - b) for a, b in zip(streamed[1:], expected[1:], strict=True)) < 1e-5
