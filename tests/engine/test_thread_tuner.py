"""The engine's team size: the tuner follows the faster count, and switching never changes outputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from python_backend.engine import engine as engine_module
from python_backend.engine.engine import Engine
from python_backend.engine.thread_tuner import ComputeTeam, ThreadTuner, TunerPolicy
from python_backend.model.loader import LoadedModel
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.device import engine_test_device
from tests.fixtures.engine_driver import Driver

StepTime = Callable[[int], float]  # thread count -> seconds of one decode step


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(tuner: ThreadTuner, clock: FakeClock, step_time: StepTime, steps: int, rows: int = 16) -> list[int]:
    """``steps`` decode steps whose time depends only on the thread count; the counts used."""
    used = []
    for _ in range(steps):
        threads = tuner.next_step()
        seconds = step_time(threads)
        clock.now += seconds
        tuner.observe(threads, rows, seconds)
        used.append(threads)
    return used


def alone(threads: int) -> float:
    return {1: 0.064, 2: 0.040}[threads]


def beside_a_busy_process(threads: int) -> float:
    return {1: 0.070, 2: 0.320}[threads]


def test_it_switches_down_when_fewer_threads_are_faster_and_back_up_when_the_neighbour_leaves() -> None:
    clock = FakeClock()
    tuner = ThreadTuner(2, clock=clock)
    _run(tuner, clock, alone, 200)  # 8 s alone: the probes of 1 thread lose
    assert tuner.threads == 2 and tuner.switches == 0
    _run(tuner, clock, beside_a_busy_process, 20)  # the slow steps start a probe at once
    assert tuner.threads == 1 and tuner.switches == 1
    used = _run(tuner, clock, beside_a_busy_process, 300)  # 21 s beside it: 2 threads keep losing
    assert tuner.threads == 1
    assert used.count(2) <= 5  # each losing probe ends at its first slow step, and they grow rarer
    _run(tuner, clock, alone, 200)  # the neighbour left: within the longest interval, back to 2
    assert tuner.threads == 2 and tuner.switches == 2


def test_a_count_that_is_only_a_little_faster_is_not_taken() -> None:
    clock = FakeClock()
    tuner = ThreadTuner(2, clock=clock)
    _run(tuner, clock, lambda threads: {1: 0.038, 2: 0.040}[threads], 500)  # 5 % faster, margin 10 %
    assert tuner.threads == 2 and tuner.switches == 0
    _run(tuner, clock, lambda threads: {1: 0.030, 2: 0.040}[threads], 500)  # 25 % faster
    assert tuner.threads == 1


def test_probes_that_change_nothing_come_less_often_up_to_the_longest_interval() -> None:
    clock = FakeClock()
    policy = TunerPolicy(first_interval_s=1.0, max_interval_s=4.0)
    tuner = ThreadTuner(2, policy=policy, clock=clock)
    probe_starts: list[float] = []
    previous = 2
    for _ in range(1000):  # 40 s alone
        threads = tuner.next_step()
        if threads == 1 and previous == 2:
            probe_starts.append(clock.now)
        previous = threads
        clock.now += alone(threads)
        tuner.observe(threads, 16, alone(threads))
    gaps = [b - a for a, b in zip(probe_starts, probe_starts[1:], strict=False)]
    # Each wait starts when the previous probe ends, a step or two after it started.
    assert 2.0 <= gaps[0] < 2.3
    assert len(gaps) >= 5 and all(4.0 <= gap < 4.3 for gap in gaps[1:])
    assert tuner.switches == 0


def test_on_a_crowded_machine_a_costly_losing_probe_waits_longer() -> None:
    clock = FakeClock()
    tuner = ThreadTuner(2, clock=clock)
    crowded = {1: 0.2, 2: 2.0}.__getitem__  # one thread fewer is ten times faster
    _run(tuner, clock, crowded, 20)
    assert tuner.threads == 1
    started = clock.now
    used = _run(tuner, clock, crowded, 600)  # 2 minutes
    # Each losing probe costs 1.8 s, so the next waits 36 s (5 % of the time), not 8 s.
    assert tuner.threads == 1 and 2 <= used.count(2) <= 4
    assert sum(1.8 for threads in used if threads == 2) / (clock.now - started) < 0.07


def test_a_single_slow_step_does_not_start_a_probe_but_a_run_of_them_does() -> None:
    clock = FakeClock()
    tuner = ThreadTuner(
        2, policy=TunerPolicy(first_interval_s=1.0, max_interval_s=64.0, longest_wait_s=64.0), clock=clock
    )
    _run(tuner, clock, alone, 2000)  # 80 s alone: the next probe is most of a minute away
    assert tuner.threads == 2
    for _ in range(20):  # one slow step now and then (a page fault, a collector pass)
        _run(tuner, clock, beside_a_busy_process, 1)
        _run(tuner, clock, alone, 5)
    assert tuner.threads == 2
    _run(tuner, clock, beside_a_busy_process, 10)
    assert tuner.threads == 1


def test_slow_steps_at_another_batch_size_start_no_probe() -> None:
    clock = FakeClock()
    tuner = ThreadTuner(
        2, policy=TunerPolicy(first_interval_s=1.0, max_interval_s=64.0, longest_wait_s=64.0), clock=clock
    )
    _run(tuner, clock, alone, 2000, rows=2)
    used = _run(tuner, clock, lambda threads: 4 * alone(threads), 50, rows=32)  # a larger batch
    assert 1 not in used


def test_many_threads_step_down_one_at_a_time_to_the_fastest() -> None:
    clock = FakeClock()
    tuner = ThreadTuner(8, clock=clock)
    # Two of eight cores are busy: 6 threads are fastest, more wait for preempted ones.
    times = {8: 0.30, 7: 0.20, 6: 0.05, 5: 0.06, 4: 0.07, 3: 0.09, 2: 0.12, 1: 0.2}
    _run(tuner, clock, times.__getitem__, 600)
    assert tuner.threads == 6


def test_one_thread_never_probes() -> None:
    clock = FakeClock()
    tuner = ThreadTuner(1, clock=clock)
    assert set(_run(tuner, clock, lambda threads: 0.05, 200)) == {1}


@pytest.mark.parametrize(
    "policy",
    [
        {"probe_steps": 0},
        {"margin": 1.0},
        {"abort_ratio": 1.0},
        {"first_interval_s": 5.0, "max_interval_s": 1.0},
        {"max_interval_s": 100.0},
        {"loss_share": 0.0},
    ],
)
def test_a_policy_that_cannot_work_is_refused(policy: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        TunerPolicy(**policy)


def test_the_team_is_set_only_when_its_size_changes_and_prefill_gets_the_chosen_count() -> None:
    clock = FakeClock()
    tuner = ThreadTuner(2, policy=TunerPolicy(first_interval_s=0.0, max_interval_s=0.0), clock=clock)
    calls: list[int] = []
    ticks = iter(float(i) / 10 for i in range(100))
    team = ComputeTeam(2, calls.append, tuner, timer=lambda: next(ticks))
    for _ in range(2):
        with team.decode(rows=4):
            pass
    # The probe's first step runs with the chosen 2 (no call), its second with 1, then back to 2.
    assert calls == [1, 2]
    with team.decode(rows=0):  # nothing to decode: not timed, nothing set
        pass
    assert calls == [1, 2] and team.threads == 2


def test_switching_thread_counts_does_not_change_greedy_outputs(
    tiny_loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    if tiny_loaded.device.type != "cpu":
        pytest.skip("the team size is tuned on CPU only")
    prompts = [f"Tell me about the number {i}." for i in range(6)]
    sizes: list[int] = []

    def set_team_size(threads: int) -> None:
        sizes.append(threads)
        torch.set_num_threads(threads)

    monkeypatch.setattr(engine_module, "set_team_size", set_team_size)

    def outputs(adaptive: bool, policy: TunerPolicy | None = None) -> list[str]:
        settings = EngineSettings(
            model_path="unused",
            dtype="float32",
            device=engine_test_device(),
            torch_threads=2,
            cpu_adaptive_threads=adaptive,
        )
        engine = Engine(tiny_loaded, settings, thread_policy=policy)
        engine.start()
        driver = Driver(engine, tiny_loaded)
        try:
            collected = [driver.submit(p, max_tokens=24, temperature=0, ignore_eos=True) for p in prompts]
            return [c.wait().text() for c in collected]
        finally:
            engine.stop()

    fixed = outputs(adaptive=False)
    assert sizes == []

    class Alternating(ThreadTuner):
        """Every decode step with the other count, whatever the step times: the outputs must
        not depend on how fast a busy machine ran the probes."""

        def next_step(self) -> int:
            self._turn = 1 if getattr(self, "_turn", 2) == 2 else 2
            return self._turn

        def observe(self, threads: int, rows: int, seconds: float) -> None:
            pass

    monkeypatch.setattr(engine_module, "ThreadTuner", Alternating)
    switched = outputs(adaptive=True)
    assert sizes.count(1) >= 4 and sizes.count(2) >= 4
    assert switched == fixed
