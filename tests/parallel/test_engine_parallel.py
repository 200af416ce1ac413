"""Two CPU ranks over gloo answer exactly as one: greedy text, seeded samples, the prefix cache,
cancellation and beam search."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.engine_driver import Collected
from tests.parallel.ranks_driver import served

# Eight prompts of different lengths, each with its own output length: rows join and leave the
# batch at different steps, and prompts are left-padded against each other.
PROMPTS = [("the quick brown fox " * (2 * i + 1)) + f"question {i}?" for i in range(8)]
SYSTEM = "you are a careful assistant who answers in plain words. " * 3  # long enough to be cached


@dataclass
class Answers:
    greedy: list[str]
    seeded: list[str]
    cached_tokens: int
    cancelled_deltas: int
    after_cancel: str
    beams: list[str]
    kv_bytes_per_token: int


def _answers(model_dir: Path, ranks: int) -> Answers:
    with served(model_dir, ranks, max_iter_times=4096) as model:
        driver = model.driver
        runs = [driver.submit(p, temperature=0, max_tokens=12 + 3 * i) for i, p in enumerate(PROMPTS)]
        greedy = [run.wait().text() for run in runs]
        assert all(run.error is None for run in runs)
        seeded = driver.submit("tell me a story", temperature=0.9, top_p=0.95, seed=1234, n=2, max_tokens=24).wait()
        driver.submit(SYSTEM + "first question", temperature=0, max_tokens=8).wait()
        repeat = driver.submit(SYSTEM + "second question", temperature=0, max_tokens=8).wait()
        holder: list[Collected] = []
        long = driver.submit(
            "write forever", temperature=0, max_tokens=4000, ignore_eos=True, cancelled=lambda: bool(holder[0].events)
        )
        holder.append(long)
        long.wait()
        after = driver.submit(PROMPTS[3], temperature=0, max_tokens=20).wait()
        beams = driver.submit("beam me up", stream=False, use_beam_search=True, n=2, max_tokens=8).wait()
        return Answers(
            greedy=greedy,
            seeded=[seeded.text(0), seeded.text(1)],
            cached_tokens=repeat.usage().cached_tokens,
            cancelled_deltas=len(long.deltas),
            after_cancel=after.text(),
            beams=[beams.text(0), beams.text(1)],
            kv_bytes_per_token=model.engine.limits.kv_bytes_per_token,
        )


@pytest.mark.parametrize("model", ["tiny_llama_dir", "tiny_model_dir"])
def test_two_ranks_give_the_answers_of_one(model: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(model)
    one = _answers(model_dir, 1)
    two = _answers(model_dir, 2)
    assert all(one.greedy) and len(set(one.greedy)) == len(PROMPTS)  # real, distinct text to compare
    assert two.greedy == one.greedy
    assert two.seeded == one.seeded and two.seeded[0] != two.seeded[1]
    assert two.cached_tokens == one.cached_tokens > 0
    assert 0 < two.cancelled_deltas < 4000  # cancelled mid-answer, as on one rank
    assert two.after_cancel == one.after_cancel  # the ranks are still in step after the cancel
    assert two.beams == one.beams and all(two.beams)  # every rank picks the same beams
    # Each rank holds half of the key/value heads: its KV budget counts half the bytes per token.
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token


def test_no_rank_process_is_left_after_close(tiny_llama_dir: Path) -> None:
    with served(tiny_llama_dir, 2) as model:
        assert model.ranks is not None
        pids = model.ranks.pids
        assert model.driver.submit("hi", temperature=0, max_tokens=4).wait().error is None
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
