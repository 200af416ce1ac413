"""stream_interval: tokens per streamed response, as vLLM's --stream-interval."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from python_backend.model.loader import LoadedModel
from python_backend.protocol.settings import EngineSettings, SettingsError
from tests.fixtures.engine_driver import Driver, make_engine

MAX_TOKENS = 14


@pytest.fixture
def every_fourth(tiny_loaded: LoadedModel) -> Iterator[Driver]:
    engine = make_engine(tiny_loaded, stream_interval=4)
    yield Driver(engine, tiny_loaded)
    engine.stop()


def test_first_text_at_once_then_every_interval_tokens_and_the_rest_at_the_end(
    every_fourth: Driver, driver: Driver
) -> None:
    params: dict[str, Any] = {
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    grouped = every_fourth.submit("group my tokens", **params).wait()
    single = driver.submit("group my tokens", **params).wait()

    # The client sees the same answer, in fewer responses.
    assert grouped.text() == single.text()
    assert len(grouped.deltas) < len(single.deltas)
    # Token counts at each response: the first as soon as its text exists, then steps of 4, and
    # whatever is left with the finish reason.
    counts = [d.num_output_tokens for d in grouped.deltas]
    first_text = next(d.num_output_tokens for d in single.deltas if d.text)
    assert counts[0] == first_text
    assert all(b - a >= 4 for a, b in zip(counts, counts[1:-1], strict=False))
    assert counts[-1] == MAX_TOKENS and grouped.deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in grouped.deltas[:-1])
    # Nothing per token is lost: one logprob entry per token, the same tokens, and the usage's
    # per-token telemetry arrays are as long as the answer.
    entries = [lp.token for d in grouped.deltas for lp in d.logprobs or []]
    assert entries == [lp.token for d in single.deltas for lp in d.logprobs or []]
    assert len(entries) == MAX_TOKENS
    usage = grouped.last().usage
    assert usage is not None and usage.completion_tokens == MAX_TOKENS
    assert len(usage.batch_size) == len(usage.queue_wait_time) == len(usage.decode_time_arr) + 1 == MAX_TOKENS


def test_each_choice_of_n_is_grouped_on_its_own(every_fourth: Driver) -> None:
    got = every_fourth.submit("two answers", temperature=1.0, seed=3, n=2, max_tokens=9, ignore_eos=True).wait()
    for index in (0, 1):
        counts = [d.num_output_tokens for d in got.deltas if d.index == index]
        assert counts[-1] == 9
        assert len(counts) <= 1 + 2 + 1  # first text, every 4 tokens, the rest at the end


def test_stop_string_still_ends_the_answer_without_leaking(every_fourth: Driver, driver: Driver) -> None:
    plain = driver.submit("stop me", temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True).wait().text()
    stop = plain[len(plain) // 2 : len(plain) // 2 + 3]
    grouped = every_fourth.submit("stop me", temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, stop=[stop]).wait()
    assert grouped.text() == plain[: plain.index(stop)]
    assert grouped.last().finish_reason == "stop"


def test_stream_interval_must_be_positive() -> None:
    with pytest.raises(SettingsError, match="stream_interval"):
        EngineSettings(model_path="m", stream_interval=0)
