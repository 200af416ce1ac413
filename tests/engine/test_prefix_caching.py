"""Prefix caching in the engine: reused prompt starts answer exactly as a full prefill does."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from python_backend.model.loader import LoadedModel
from tests.fixtures.engine_driver import Collected, Driver, make_engine

SYSTEM = "you are a careful assistant who answers in plain words. " * 3
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 20, "ignore_eos": True, "logprobs": True, "top_logprobs": 5}


@pytest.fixture
def cached(tiny_loaded: LoadedModel) -> Iterator[Driver]:
    engine = make_engine(tiny_loaded)
    yield Driver(engine, tiny_loaded)
    engine.stop()


@pytest.fixture
def uncached(tiny_loaded: LoadedModel) -> Iterator[Driver]:
    engine = make_engine(tiny_loaded, enable_prefix_caching=False)
    yield Driver(engine, tiny_loaded)
    engine.stop()


def logprobs(run: Collected) -> list[tuple[float, list[tuple[int, ...]]]]:
    """Each generated token's logprob and its top alternatives' byte strings, in order."""
    out = []
    for delta in run.deltas:
        for entry in delta.logprobs or []:
            out.append((entry.logprob, [tuple(t.bytes) for t in entry.top_logprobs]))
    return out


def assert_same_answer(got: Collected, expected: Collected) -> None:
    assert got.error is None and expected.error is None
    assert got.text() == expected.text()
    ours, theirs = logprobs(got), logprobs(expected)
    assert len(ours) == len(theirs) == GREEDY["max_tokens"]
    for (lp, top), (ref_lp, ref_top) in zip(ours, theirs, strict=True):
        assert top == ref_top
        assert abs(lp - ref_lp) < 1e-4


def common_prefix(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


def test_a_repeated_prompt_reuses_all_but_its_last_token(cached: Driver, uncached: Driver) -> None:
    reference = uncached.submit(SYSTEM + "what is a licence?", **GREEDY).wait()
    first = cached.submit(SYSTEM + "what is a licence?", **GREEDY).wait()
    second = cached.submit(SYSTEM + "what is a licence?", **GREEDY).wait()
    prompt_tokens = len(cached.prompt_ids(SYSTEM + "what is a licence?"))
    assert first.usage().cached_tokens == 0
    assert second.usage().cached_tokens == prompt_tokens - 1
    assert reference.usage().cached_tokens == 0
    assert_same_answer(first, reference)
    assert_same_answer(second, reference)
    stats = cached.engine.stats()
    # One entry: the prompt and the answer's tokens but the last (the prompt alone is a prefix of it).
    assert stats.prefix_cache_tokens == prompt_tokens + GREEDY["max_tokens"] - 1 and stats.prefix_cache_bytes > 0
    assert uncached.engine.stats().prefix_cache_tokens == 0


def test_prompts_sharing_a_start_reuse_it_in_one_batch(cached: Driver, uncached: Driver) -> None:
    cached.submit(SYSTEM + "first question", **GREEDY).wait()
    warm_ids = cached.prompt_ids(SYSTEM + "first question")
    prompts = [
        SYSTEM + "second, short",
        SYSTEM + "a third question, quite a bit longer than the second one was",
        "an unrelated prompt that shares nothing with the others",
        SYSTEM + "first question",
    ]
    # A long request keeps the loop busy, so the four wait together and join in the same step.
    busy = cached.submit("keep the engine busy", temperature=0, max_tokens=64, ignore_eos=True)
    runs = [cached.submit(p, **GREEDY) for p in prompts]
    references = [uncached.submit(p, **GREEDY) for p in prompts]
    for run, reference, prompt in zip(runs, references, prompts, strict=True):
        run.wait()
        reference.wait()
        assert_same_answer(run, reference)
        shared = common_prefix(cached.prompt_ids(prompt), warm_ids)
        reused = run.usage().cached_tokens
        if shared >= 16:
            assert 0 < reused <= min(shared, len(cached.prompt_ids(prompt)) - 1)
        else:
            assert reused == 0
    busy.wait()


def test_a_long_prompt_prefilled_in_chunks_starts_from_the_cached_prefix(tiny_loaded: LoadedModel) -> None:
    long_system = SYSTEM * 3
    engines = [
        make_engine(tiny_loaded, max_num_batched_tokens=16),
        make_engine(tiny_loaded, max_num_batched_tokens=16, enable_prefix_caching=False),
    ]
    try:
        on, off = (Driver(e, tiny_loaded) for e in engines)
        on.submit(long_system + "warm the cache", **GREEDY).wait()
        prompt = long_system + "now a different and much longer question than the one before it"
        got = on.submit(prompt, **GREEDY).wait()
        expected = off.submit(prompt, **GREEDY).wait()
        assert_same_answer(got, expected)
        shared = common_prefix(on.prompt_ids(prompt), on.prompt_ids(long_system + "warm the cache"))
        assert got.usage().cached_tokens == shared
        assert len(on.prompt_ids(prompt)) - shared > 16  # the rest did need chunks
    finally:
        for engine in engines:
            engine.stop()


def test_the_same_seed_samples_the_same_with_a_cached_prefix(cached: Driver, uncached: Driver) -> None:
    params: dict[str, Any] = {"temperature": 1.0, "top_p": 0.9, "seed": 12345, "max_tokens": 16, "ignore_eos": True}
    expected = uncached.submit(SYSTEM + "sample me", **params).wait().text()
    cached.submit(SYSTEM + "sample me", **params).wait()
    again = cached.submit(SYSTEM + "sample me", **params).wait()
    assert again.usage().cached_tokens > 0
    assert again.text() == expected


def test_beam_search_reports_its_cached_tokens(cached: Driver, uncached: Driver) -> None:
    params: dict[str, Any] = {"use_beam_search": True, "n": 2, "temperature": 0, "max_tokens": 8, "stream": False}
    cached.submit(SYSTEM + "beam", **params).wait()
    got = cached.submit(SYSTEM + "beam", **params).wait()
    expected = uncached.submit(SYSTEM + "beam", **params).wait()
    assert [d.text for d in got.deltas] == [d.text for d in expected.deltas]
    assert all(d.usage is not None and d.usage.cached_tokens > 0 for d in got.deltas)


def test_the_next_turn_of_a_chat_reuses_the_previous_answer(cached: Driver, uncached: Driver) -> None:
    first = cached.submit(SYSTEM + "first question", temperature=0, max_tokens=24, ignore_eos=True).wait()
    history = [{"role": "user", "content": SYSTEM + "first question"}, {"role": "assistant", "content": first.text()}]
    turn_one_tokens = len(cached.prompt_ids(SYSTEM + "first question"))
    got = cached.submit("and a follow-up", history=history, **GREEDY).wait()
    expected = uncached.submit("and a follow-up", history=history, **GREEDY).wait()
    # Beyond the first prompt: the answer's tokens were cached when it finished.
    assert got.usage().cached_tokens > turn_one_tokens
    assert got.text() == expected.text()
    for (lp, top), (ref_lp, ref_top) in zip(logprobs(got), logprobs(expected), strict=True):
        assert top == ref_top
        assert abs(lp - ref_lp) < 1e-4
