"""Speculative decoding on tiny models (float32): the same answers, deltas and usage as without.

Each test runs the same requests through an engine without speculation and one with n-gram
drafts (4 a step) and compares what the client sees. The looping model (attention only) copies
its repetitive prompts and loops, so most of its drafts are accepted, and in a batch the rows
accept different numbers, which leaves holes in the batch cache that later steps must not
attend to (these tests fail when the holes are not masked); the random model's answers rarely
repeat, so its drafts (from 1-grams) are rejected.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from python_backend.engine.liveness import EngineStats
from python_backend.model.loader import LoadedModel, load_model
from python_backend.prompt.chat_template import render_prompt
from python_backend.protocol.params import parse_parameters
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.device import engine_test_device
from tests.fixtures.engine_driver import Collected, Driver, make_engine
from tests.fixtures.looping_model import build_looping_model

SPECULATIVE = {"speculative_ngram_tokens": 4, "speculative_ngram_min": 2, "speculative_ngram_max": 4}
REPETITIVE = [f"quote {i}: " + "the software is provided as is, without warranty " * (2 + i) for i in range(4)]
DISTINCT = ["Tell me about licences.", "why is the sky blue", "list three fruits", "count to ten"]


@pytest.fixture(scope="module")
def looping(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    folder = build_looping_model(tiny_model_dir, tmp_path_factory.mktemp("looping"))
    yield load_model(EngineSettings(model_path=str(folder), dtype="float32", device=engine_test_device()))


@dataclass
class Run:
    answers: list[Collected]
    stats: EngineStats


def run(loaded: LoadedModel, requests: list[tuple[str, dict[str, Any]]], **settings: Any) -> Run:
    """Submit every request at once (they share decode steps) and wait for all of them."""
    engine = make_engine(loaded, **settings)
    try:
        driver = Driver(engine, loaded)
        answers = [driver.submit(content, **params) for content, params in requests]
        for answer in answers:
            answer.wait()
        return Run(answers, engine.stats())
    finally:
        engine.stop()


def seen(answer: Collected) -> list[tuple[int, str, str | None, int]]:
    """What the client sees, delta by delta: choice, text, finish reason, tokens so far."""
    return [(d.index, d.text, d.finish_reason, d.num_output_tokens) for d in answer.deltas]


def greedy_tokens(loaded: LoadedModel, content: str, count: int) -> list[int]:
    ids = render_prompt(loaded.tokenizer, [{"role": "user", "content": content}], parse_parameters({}))
    out = loaded.model.generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=count, do_sample=False, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    return [int(t) for t in out[0, len(ids) :]]


def assert_same(off: Run, on: Run) -> None:
    for plain, speculated in zip(off.answers, on.answers, strict=True):
        assert speculated.error is None
        assert seen(speculated) == seen(plain)
        usage, expected = speculated.usage(), plain.usage()
        assert usage.completion_tokens == expected.completion_tokens
        assert len(usage.batch_size) == len(usage.decode_time_arr) + 1 == usage.completion_tokens


def test_greedy_batch_is_token_identical_with_and_without_speculation(looping: LoadedModel) -> None:
    requests = [(p, {"temperature": 0, "max_tokens": 48, "ignore_eos": True}) for p in REPETITIVE + DISTINCT]
    off = run(looping, requests)
    on = run(looping, requests, **SPECULATIVE)
    assert_same(off, on)
    stats = on.stats
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens
    assert stats.spec_decode_num_steps > 0
    assert off.stats.spec_decode_num_draft_tokens == 0


def test_drafts_that_are_all_rejected_change_nothing(tiny_loaded: LoadedModel) -> None:
    """The random model: 1-gram drafts, nearly all rejected, in a batch whose rows leave one by one."""
    requests = [(p, {"temperature": 0, "max_tokens": 40 + 8 * i, "ignore_eos": True}) for i, p in enumerate(DISTINCT)]
    settings = {**SPECULATIVE, "speculative_ngram_min": 1}
    off = run(tiny_loaded, requests)
    on = run(tiny_loaded, requests, **settings)
    assert_same(off, on)
    assert on.stats.spec_decode_num_draft_tokens > 4 * on.stats.spec_decode_num_accepted_tokens


def test_logprobs_keep_their_exact_values_beside_speculating_rows(looping: LoadedModel) -> None:
    greedy = {"temperature": 0, "max_tokens": 40, "ignore_eos": True}
    requests = [
        (REPETITIVE[0], greedy),
        (DISTINCT[0], {**greedy, "max_tokens": 12, "logprobs": True, "top_logprobs": 2}),
        (REPETITIVE[1], greedy),
    ]
    off = run(looping, requests)
    on = run(looping, requests, **SPECULATIVE)
    assert_same(off, on)
    values = [[(p.token_id, p.logprob) for d in r.answers[1].deltas for p in d.logprobs or []] for r in (off, on)]
    assert [t for t, _ in values[1]] == [t for t, _ in values[0]] and len(values[0]) == 12
    # Within float rounding: which prompts share a prefill pass varies from run to run.
    assert max(abs(a - b) for (_, a), (_, b) in zip(values[0], values[1], strict=True)) < 1e-5
    assert on.stats.spec_decode_num_accepted_tokens > 0  # once it has finished, the others speculate


def test_one_request_alone_is_identical_and_takes_several_tokens_a_step(looping: LoadedModel) -> None:
    requests = [(REPETITIVE[1], {"temperature": 0, "max_tokens": 64, "ignore_eos": True})]
    off = run(looping, requests)
    on = run(looping, requests, **SPECULATIVE)
    assert_same(off, on)
    assert on.stats.spec_decode_num_accepted_tokens > 8


def test_stops_inside_drafts_end_at_the_same_token(looping: LoadedModel) -> None:
    content = REPETITIVE[2]
    tokens = greedy_tokens(looping, content, 40)
    text = looping.tokenizer.decode(tokens, skip_special_tokens=True)
    stop_string = text[len(text) // 2 : len(text) // 2 + 3]
    stop_token = next(t for i, t in enumerate(tokens) if i >= 4 and t not in tokens[:i])
    base: dict[str, Any] = {"temperature": 0, "max_tokens": 40, "ignore_eos": True}
    requests: list[tuple[str, dict[str, Any]]] = [
        (content, {**base, "stop": [stop_string]}),
        (content, {**base, "stop": [stop_string], "include_stop_str_in_output": True}),
        (content, {**base, "stop_token_ids": [stop_token]}),
        (content, {**base, "min_tokens": 20, "stop_token_ids": [tokens[0]]}),
        *[(content, {**base, "max_tokens": n}) for n in (5, 9, 13, 17)],
    ]
    off = run(looping, requests)
    on = run(looping, requests, **SPECULATIVE)
    assert_same(off, on)
    reasons = [a.last().finish_reason for a in off.answers]
    assert reasons[:3] == ["stop", "stop", "stop"] and reasons[4:] == ["length"] * 4
    assert on.stats.spec_decode_num_accepted_tokens > 0


def test_eos_inside_a_draft_ends_the_answer_there(looping: LoadedModel) -> None:
    """The model's EOS set (not ignored) ends a row inside accepted drafts exactly as without."""
    content = REPETITIVE[0]
    tokens = greedy_tokens(looping, content, 40)
    eos = next(t for i, t in enumerate(tokens) if i >= 4 and t not in tokens[:i])
    loaded = replace(looping, eos_token_ids=frozenset({eos}))
    requests = [(content, {"temperature": 0, "max_tokens": 40})]
    off = run(loaded, requests)
    on = run(loaded, requests, **SPECULATIVE)
    assert_same(off, on)
    assert off.answers[0].last().finish_reason == "stop"
    assert off.answers[0].usage().completion_tokens == tokens.index(eos) + 1


def test_seeded_sampling_draws_the_same_tokens_with_and_without_speculation(looping: LoadedModel) -> None:
    sampled = {"temperature": 0.4, "top_k": 20, "top_p": 0.9, "max_tokens": 40, "ignore_eos": True}
    requests = [
        (REPETITIVE[1], {**sampled, "seed": 11}),
        (REPETITIVE[3], {**sampled, "seed": 12, "presence_penalty": 0.2, "min_p": 0.05}),
        (REPETITIVE[2], {**sampled, "seed": 13, "n": 2}),
        (DISTINCT[1], {**sampled, "seed": 14, "repetition_penalty": 1.1}),
    ]
    off = run(looping, requests)
    on = run(looping, requests, **SPECULATIVE)
    for plain, speculated in zip(off.answers, on.answers, strict=True):
        assert speculated.text(0) == plain.text(0) and speculated.text(1) == plain.text(1)
    assert on.stats.spec_decode_num_accepted_tokens > 0


def test_streams_get_the_same_deltas_at_a_stream_interval(looping: LoadedModel) -> None:
    requests = [(p, {"temperature": 0, "max_tokens": 30, "ignore_eos": True}) for p in REPETITIVE[:2]]
    off = run(looping, requests, stream_interval=3)
    on = run(looping, requests, stream_interval=3, **SPECULATIVE)
    assert_same(off, on)
    assert on.stats.spec_decode_num_accepted_tokens > 0


def test_a_batch_above_the_threshold_decodes_plainly_and_answers_the_same(looping: LoadedModel) -> None:
    requests = [(p, {"temperature": 0, "max_tokens": 40, "ignore_eos": True}) for p in REPETITIVE]
    off = run(looping, requests)
    always = run(looping, requests, **SPECULATIVE)
    loaded = run(looping, requests, **SPECULATIVE, speculative_disable_by_batch_size=1)
    assert_same(off, loaded)
    # Four rows run together most of the time: only the tail, one row left, may speculate.
    assert loaded.stats.spec_decode_num_steps < always.stats.spec_decode_num_steps
    alone = run(looping, requests[1:2], **SPECULATIVE, speculative_disable_by_batch_size=1)
    assert_same(run(looping, requests[1:2]), alone)
    assert alone.stats.spec_decode_num_accepted_tokens > 0  # one row: at the threshold, it speculates


@pytest.mark.skipif(engine_test_device() != "cpu", reason="kv_cache_dtype bfloat16 is a CPU setting")
def test_a_bfloat16_cache_speculates_and_answers_as_without(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """--kv-cache-dtype bfloat16: verify steps read the bfloat16 batch cache widened, and the
    answers equal plain decoding over the same cache."""
    folder = build_looping_model(tiny_model_dir, tmp_path_factory.mktemp("looping-bf16kv"))
    loaded = load_model(EngineSettings(model_path=str(folder), dtype="float32", kv_cache_dtype="bfloat16"))
    assert loaded.kv_dtype == torch.bfloat16
    requests = [(p, {"temperature": 0, "max_tokens": 32, "ignore_eos": True}) for p in REPETITIVE[:3]]
    off = run(loaded, requests)
    on = run(loaded, requests, **SPECULATIVE)
    assert_same(off, on)
    assert on.stats.spec_decode_num_accepted_tokens > 0
