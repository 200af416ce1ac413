"""The engine's output rules on the tiny model: greedy equals generate, stops, lengths, usage."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from python_backend.engine.engine import Engine
from python_backend.protocol.errors import ContractError
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.engine_driver import Driver, make_engine, usage_of


def generate_greedy(driver: Driver, content: str, max_new_tokens: int) -> list[int]:
    ids = driver.prompt_ids(content)
    out = driver.loaded.model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()


def decode(driver: Driver, tokens: list[int]) -> str:
    text = driver.loaded.tokenizer.decode(tokens, skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence decodes to one string
    return text


def test_greedy_matches_generate_alone(driver: Driver) -> None:
    expected = decode(driver, generate_greedy(driver, "Tell me about licences.", 24))
    got = driver.submit("Tell me about licences.", temperature=0, max_tokens=24, ignore_eos=True).wait()
    assert got.text() == expected
    assert got.last().finish_reason == "length"


def test_greedy_in_a_batch_matches_generate_for_every_request(driver: Driver) -> None:
    prompts = [f"request {i}: " + "the software is provided as is " * (i + 1) for i in range(8)]
    expected = [decode(driver, generate_greedy(driver, p, 64)) for p in prompts]
    collected = []
    for prompt in prompts:  # requests join while earlier ones are decoding
        collected.append(driver.submit(prompt, temperature=0, max_tokens=64, ignore_eos=True))
        time.sleep(0.005)
    texts = [c.wait().text() for c in collected]
    assert texts == expected
    batch_sizes = [max(c.usage().batch_size) for c in collected]
    assert max(batch_sizes) > 1, "requests should have shared decode steps"


def test_same_seed_same_sample_alone_or_in_a_batch(driver: Driver) -> None:
    params: dict[str, Any] = {
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.95,
        "seed": 2**64 - 5,
        "max_tokens": 16,
        "ignore_eos": True,
    }
    alone = driver.submit("sample me", **params).wait().text()
    noise = [driver.submit(f"other {i}", temperature=1.0, max_tokens=16, ignore_eos=True) for i in range(4)]
    batched = driver.submit("sample me", **params)
    more = [driver.submit(f"late {i}", temperature=0.5, max_tokens=8) for i in range(3)]
    assert batched.wait().text() == alone
    for c in noise + more:
        c.wait()


def test_max_tokens_ends_with_length_and_usage_invariants(driver: Driver) -> None:
    got = driver.submit("count", temperature=0, max_tokens=7, ignore_eos=True).wait()
    usage = got.last().usage
    assert got.last().finish_reason == "length"
    assert usage is not None
    assert usage.completion_tokens == 7
    assert len(usage.batch_size) == len(usage.queue_wait_time) == 7
    assert len(usage.decode_time_arr) == 6
    assert usage.prefill_time > 0
    assert all(t >= 0 for t in usage.decode_time_arr)
    assert usage.prompt_tokens == len(driver.prompt_ids("count"))


def test_stop_string_split_across_tokens_never_leaks(driver: Driver) -> None:
    tokens = generate_greedy(driver, "stop test", 30)
    pieces = [decode(driver, tokens[: i + 1]) for i in range(len(tokens))]
    full = pieces[-1]
    # A stop string that starts inside one token's text and ends inside a later token's.
    boundary = next(
        i for i in range(3, len(pieces)) if len(pieces[i]) - len(pieces[i - 1]) >= 2 and len(pieces[i - 1]) >= 2
    )
    start = len(pieces[boundary - 1]) - 1
    stop = full[start : start + 3]
    got = driver.submit("stop test", temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]).wait()
    expected = full[: full.index(stop)]
    assert got.text() == expected
    assert got.last().finish_reason == "stop"
    streamed = ""
    for delta in got.deltas:
        streamed += delta.text
        assert stop not in streamed
    with_stop = driver.submit(
        "stop test", temperature=0, max_tokens=30, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
    ).wait()
    assert with_stop.text() == expected + stop


def test_stop_token_ids_end_the_choice_without_the_token(driver: Driver) -> None:
    tokens = generate_greedy(driver, "stop token", 12)
    target = tokens[5]
    first = tokens.index(target)
    got = driver.submit("stop token", temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[target]).wait()
    assert got.last().finish_reason == "stop"
    assert got.usage().completion_tokens == first + 1
    assert got.text() == decode(driver, tokens[:first])


def test_non_streaming_sends_one_response_per_choice(driver: Driver) -> None:
    got = driver.submit("non stream", stream=False, temperature=0, max_tokens=9, ignore_eos=True).wait()
    assert len(got.deltas) == 1
    assert got.deltas[0].finish_reason == "length"
    assert got.events[-1].final


def test_n_choices_and_best_of(driver: Driver) -> None:
    got = driver.submit("many", temperature=1.0, n=3, max_tokens=5, ignore_eos=True, seed=7).wait()
    assert sorted({d.index for d in got.deltas}) == [0, 1, 2]
    for i in range(3):
        assert got.usage(i).completion_tokens == 5
    assert sum(1 for e in got.events if e.final) == 1
    best = driver.submit("many", stream=False, temperature=1.0, n=1, best_of=4, max_tokens=5, ignore_eos=True).wait()
    assert [d.index for d in best.deltas] == [0]
    assert best.deltas[0].logprobs is None


def test_logprobs_report_token_bytes(driver: Driver) -> None:
    got = driver.submit("logprobs", temperature=0, max_tokens=4, ignore_eos=True, logprobs=True, top_logprobs=3).wait()
    entries = [lp for d in got.deltas for lp in (d.logprobs or [])]
    assert len(entries) == 4
    for entry in entries:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy picked the best
        assert all(0 <= b < 256 for b in entry.bytes)


def test_prompt_too_long_is_a_400(tiny_loaded) -> None:
    engine = make_engine(tiny_loaded, max_input_token_len=10)
    try:
        driver = Driver(engine, tiny_loaded)
        with pytest.raises(ContractError) as caught:
            driver.submit("this prompt is certainly longer than ten tokens once templated")
        info = caught.value.info
        assert info.status == 400 and info.code == "context_length_exceeded" and info.param == "messages"
    finally:
        engine.stop()


def test_max_tokens_is_capped_by_max_iter_times(driver: Driver) -> None:
    got = driver.submit("cap", temperature=0, max_tokens=1000, ignore_eos=True).wait()
    assert got.usage().completion_tokens == 64
    assert got.last().finish_reason == "length"


def test_min_tokens_suppresses_eos(driver: Driver) -> None:
    eos = sorted(driver.loaded.eos_token_ids)
    got = driver.submit("min", temperature=0, max_tokens=10, min_tokens=10, stop_token_ids=eos).wait()
    assert got.usage().completion_tokens == 10


def test_batched_prefill_of_different_lengths_matches_generate(tiny_loaded) -> None:
    # The prefill's own left-padded pass (mixed steps are tested in test_mixed_prefill.py).
    settings = EngineSettings(
        model_path="unused", dtype="float32", device="cpu", max_num_batched_tokens=2048, mixed_prefill=False
    )
    engine = Engine(tiny_loaded, settings)
    try:
        driver = Driver(engine, tiny_loaded)
        prompts = ["a", "a bit longer prompt", "the longest prompt of them all, " * 4, "mid length one"]
        expected = [decode(driver, generate_greedy(driver, p, 12)) for p in prompts]
        # Queued before the loop starts, so the first step prefills all four in one forward pass.
        # The pass is observed, not timed: the first forward the engine makes carries four rows.
        shapes: list[tuple[int, ...]] = []
        forward = engine._steps.forward

        def counting_forward(adapters, cache, **inputs):  # type: ignore[no-untyped-def]
            shapes.append(tuple(inputs["input_ids"].shape))
            return forward(adapters, cache, **inputs)

        engine._steps.forward = counting_forward  # type: ignore[method-assign]
        runs = [driver.submit(p, temperature=0, max_tokens=12, ignore_eos=True) for p in prompts]
        engine.start()
        assert [r.wait().text() for r in runs] == expected
        longest = max(len(driver.prompt_ids(p)) for p in prompts)
        assert shapes[0] == (4, longest)
        assert all(max(r.usage().batch_size) == 4 for r in runs)
    finally:
        engine.stop()


def test_beam_search_matches_transformers_beam_search(driver: Driver) -> None:
    ids = driver.prompt_ids("beam me up")
    eos = sorted(driver.loaded.eos_token_ids)
    out = driver.loaded.model.generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=8,
        num_beams=3, num_return_sequences=3, do_sample=False, early_stopping=True, length_penalty=1.0,
        eos_token_id=eos, pad_token_id=0,
    )  # fmt: skip
    expected = [decode(driver, row[len(ids) :].tolist()) for row in out]
    got = driver.submit("beam me up", stream=False, use_beam_search=True, n=3, max_tokens=8).wait()
    assert [d.index for d in got.deltas] == [0, 1, 2]
    assert [d.text for d in got.deltas] == expected
    scores = [usage_of(d).cumulative_logprob / usage_of(d).completion_tokens for d in got.deltas]
    assert scores == sorted(scores, reverse=True)
    for delta in got.deltas:
        usage = usage_of(delta)
        assert len(usage.batch_size) == len(usage.queue_wait_time) == usage.completion_tokens
        assert len(usage.decode_time_arr) == usage.completion_tokens - 1


def test_beam_search_of_width_one_is_greedy(driver: Driver) -> None:
    expected = decode(driver, generate_greedy(driver, "narrow beam", 10))
    got = driver.submit("narrow beam", stream=False, use_beam_search=True, max_tokens=10, ignore_eos=True).wait()
    assert got.text() == expected


def test_beam_search_runs_beside_sampled_requests(driver: Driver) -> None:
    others = [driver.submit(f"other {i}", temperature=0, max_tokens=12, ignore_eos=True) for i in range(3)]
    beams = driver.submit("beam me up", stream=False, use_beam_search=True, n=2, max_tokens=8)
    expected = [decode(driver, generate_greedy(driver, f"other {i}", 12)) for i in range(3)]
    assert [o.wait().text() for o in others] == expected
    assert len(beams.wait().deltas) == 2
    driver.wait_idle()
