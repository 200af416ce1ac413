"""The engine's guarantees as users see them through the real tritonserver and frontend.

Batch invariance (greedy output equals transformers' generate alone, whatever else runs),
seeds, telemetry invariants under concurrency, beam search, and cancellations under load.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.e2e.conftest import TritonHandle
from tests.e2e.test_chat_e2e import client_for, running_sequences, wait_for_gauge

PROMPTS = [f"request {i}: " + "the software is provided as is, " * (i + 1) for i in range(8)]


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Callable[[str, int], str]:
    """The same weights in this process, for transformers' own greedy answers."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    def greedy(content: str, max_new_tokens: int) -> str:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        answer = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        assert isinstance(answer, str)  # one sequence decodes to one string
        return answer

    return greedy


def chat(frontend_url: str, model: str, content: str, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    reply = httpx.post(f"{frontend_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_greedy_is_batch_invariant_through_the_server(
    triton_server: TritonHandle, frontend_url: str, reference: Callable[[str, int], str]
) -> None:
    # Long enough (the tiny model writes hundreds of tokens a second) that the staggered requests
    # surely overlap.
    expected = [reference(p, 160) for p in PROMPTS]

    def ask(i: int) -> dict[str, Any]:
        time.sleep(0.02 * i)  # requests join while earlier ones are decoding
        return chat(
            frontend_url, triton_server.served_model_name, PROMPTS[i], temperature=0, max_tokens=160, ignore_eos=True
        )

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, range(8)))
    assert [r["choices"][0]["message"]["content"] for r in replies] == expected
    assert max(max(r["usage"]["batch_size"]) for r in replies) > 1, "the requests never shared a step"


def test_a_seed_samples_the_same_alone_or_in_a_batch(triton_server: TritonHandle, frontend_url: str) -> None:
    model = triton_server.served_model_name
    params = {"temperature": 1.0, "top_p": 0.9, "seed": 18446744073709551000, "max_tokens": 20, "ignore_eos": True}
    alone = chat(frontend_url, model, "roll the dice", **params)["choices"][0]["message"]["content"]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        noise = [pool.submit(chat, frontend_url, model, f"noise {i}", temperature=1.0, max_tokens=30) for i in range(5)]
        batched = pool.submit(chat, frontend_url, model, "roll the dice", **params)
        assert batched.result()["choices"][0]["message"]["content"] == alone
        for f in noise:
            f.result()


def test_telemetry_invariants_hold_for_every_choice_under_load(triton_server: TritonHandle, frontend_url: str) -> None:
    model = triton_server.served_model_name

    def streamed(i: int) -> list[dict[str, Any]]:
        body = {"model": model, "messages": [{"role": "user", "content": f"s{i}"}], "n": 2, "temperature": 0.8,
                "max_tokens": 10 + i, "stream": True}  # fmt: skip
        text = httpx.post(f"{frontend_url}/v1/chat/completions", json=body, timeout=120).text
        chunks = [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
        return [c["usage"] for c in chunks if "usage" in c]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        plain = [
            pool.submit(chat, frontend_url, model, f"q{i}", n=2, temperature=0.7, max_tokens=12 + i) for i in range(3)
        ]
        streams = [pool.submit(streamed, i) for i in range(3)]
        for future in plain:
            body = future.result()
            usage = body["usage"]
            assert len(body["choices"]) == 2
            longest = len(usage["batch_size"])  # the arrays follow the longest choice
            assert longest <= usage["completion_tokens"] <= 2 * longest  # the total over both choices
            assert longest == len(usage["queue_wait_time"]) and len(body["decode_time_arr"]) == longest - 1
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        for stream_future in streams:
            usages = stream_future.result()
            assert len(usages) == 2  # one per choice, on its final chunk
            for usage in usages:
                assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == usage["completion_tokens"]
                assert all(b >= 1 for b in usage["batch_size"])


def test_beam_search_streams_as_one_whole_answer(triton_server: TritonHandle, frontend_url: str) -> None:
    body = {"model": triton_server.served_model_name, "messages": [{"role": "user", "content": "beams"}],
            "use_beam_search": True, "n": 2, "max_tokens": 8, "stream": True}  # fmt: skip
    reply = httpx.post(f"{frontend_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200
    whole = reply.json()  # format 1: one chat.completion object, not SSE
    assert whole["object"] == "chat.completion"
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert len(whole["usage"]["batch_size"]) == max(len(whole["decode_time_arr"]) + 1, 1)


def test_cancellations_under_load_leave_no_sequence_behind(triton_server: TritonHandle, frontend_url: str) -> None:
    model = triton_server.served_model_name
    results: list[str] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": f"load {i}"}], "stream": True,
                "max_tokens": 20000 if i % 2 else 30, "ignore_eos": True}  # fmt: skip
        with (
            httpx.Client(timeout=120) as http,
            http.stream("POST", f"{frontend_url}/v1/chat/completions", json=body) as reply,
        ):
            lines = reply.iter_lines()
            seen = 0
            for line in lines:
                seen += line.startswith("data: {")
                if i % 2 and seen == 5:
                    reply.close()  # the long ones disconnect early
                    outcome = "cancelled"
                    break
                if line == "data: [DONE]":
                    outcome = "done"
                    break
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == ["cancelled"] * 4 + ["done"] * 4
    assert wait_for_gauge(triton_server, lambda v: v == 0, 5) == 0
    assert running_sequences(triton_server) == 0
    # The server is healthy afterwards.
    assert client_for(frontend_url).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "ok"}], max_tokens=2
    )


def test_a_repeated_prompt_reuses_its_cached_prefix(
    triton_server: TritonHandle, frontend_url: str, reference: Callable[[str, int], str]
) -> None:
    content = "a prompt long enough to fill whole blocks of the prefix cache, " * 3 + "asked twice"
    expected = reference(content, 24)
    replies = [
        chat(frontend_url, triton_server.served_model_name, content, temperature=0, max_tokens=24, ignore_eos=True)
        for _ in range(2)
    ]
    prompt_tokens = replies[0]["usage"]["prompt_tokens"]
    assert replies[0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert replies[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens - 1
    assert [r["choices"][0]["message"]["content"] for r in replies] == [expected, expected]
