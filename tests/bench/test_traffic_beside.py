"""The traffic benchmark beside a neighbour: alone, beside busy processes, alone again, and the recovery."""

from __future__ import annotations

import asyncio
import time

import psutil

from benchmarks.cpu_hog import Arrival, CpuHog, arrivals_of, recovery_s
from benchmarks.hog_runs import HogRuns, alone_beside_again
from benchmarks.load import RequestResult
from benchmarks.traffic import TrafficReport, Workload, run_traffic
from benchmarks.traffic_compare import markdown
from tests.bench.fake_chat import fake_chat_server, fake_run

_END = 1000.0  # when the busy processes ended, on the fake clock of these tests


def _workload() -> Workload:
    return Workload("distinct", input_len=64, input_range=32, output_len=16, output_range=8, shared_len=40, seed=3)


def _report(load: Workload, tokens_per_s: float, ttft_s: float = 0.2) -> TrafficReport:
    """A run whose output rate is ``tokens_per_s`` (one request in one second)."""
    return fake_run(
        "triton-chat",
        load,
        "closed C=16",
        requests=1,
        tokens=round(tokens_per_s),
        ttft_s=ttft_s,
        gap_s=0.04,
        prompt_tokens=100,
        wall_s=1.0,
    )


def _steady(start_s: float, end_s: float, per_s: float) -> list[Arrival]:
    """One token at a time at ``per_s`` tokens/s, from just after ``start_s`` to ``end_s``."""
    return [Arrival(start_s + (i + 1) / per_s, 1.0) for i in range(round((end_s - start_s) * per_s))]


def test_recovery_is_the_start_of_the_first_two_second_window_at_the_level() -> None:
    # 20 tok/s for 3 s after the end, then 100 tok/s: the first window at 95 tok/s starts at ~2.9 s.
    slow_then_back = _steady(_END, _END + 3, 20) + _steady(_END + 3, _END + 20, 100)
    recovered = recovery_s(slow_then_back, _END, 95.0)
    assert recovered is not None and 2.8 <= recovered <= 3.0
    assert recovery_s(_steady(_END, _END + 10, 100), _END, 95.0) == 0.0  # at the level from the start
    # A shuffled log gives the same answer: arrivals come in as requests end, not in time order.
    assert recovery_s(slow_then_back[::-1], _END, 95.0) == recovered


def test_no_recovery_when_no_window_after_the_end_reaches_the_level() -> None:
    # Fast before the end does not count; 80 tok/s after it never reaches 95.
    assert recovery_s(_steady(_END - 10, _END, 500) + _steady(_END, _END + 20, 80), _END, 95.0) is None
    assert recovery_s([], _END, 95.0) is None
    assert recovery_s(_steady(_END, _END + 10, 100), _END, 0.0) is None  # no first run to come back to


def test_a_requests_tokens_are_spread_over_its_chunks_as_they_came() -> None:
    result = RequestResult(True, tokens=6, ttft_s=0.5, gaps_s=[0.125, 0.25])
    assert arrivals_of(10.0, result) == [Arrival(10.5, 2.0), Arrival(10.625, 2.0), Arrival(10.875, 2.0)]
    assert arrivals_of(10.0, RequestResult(False, error="HTTP 503")) == []


def _busy_children() -> list[psutil.Process]:
    def busy(child: psutil.Process) -> bool:
        cmdline = child.cmdline()
        return len(cmdline) >= 3 and cmdline[1] == "-c" and "print('busy'" in cmdline[2]

    return [child for child in psutil.Process().children() if busy(child)]


def _three_runs(
    beside_per_s: float, beside_ttft_s: float, again: list[Arrival]
) -> tuple[list[tuple[Workload, bool, list[str]]], HogRuns]:
    """The three runs with fakes: 100 tok/s alone, the given figures beside, ``again``'s arrivals after."""
    seen: list[tuple[Workload, bool, list[str]]] = []

    def run(load: Workload, *, warmup: bool = True, arrivals: list[Arrival] | None = None) -> TrafficReport:
        seen.append((load, warmup, [child.status() for child in _busy_children()]))
        if load.variant == 0:
            return _report(load, 100.0)
        if load.variant == 1:
            return _report(load, beside_per_s, beside_ttft_s)
        if arrivals is not None:
            arrivals.extend(again)
        return _report(load, sum(a.tokens for a in again) / 20)

    return seen, alone_beside_again(run, _workload(), hog=1, limit_s=60.0, clock=lambda: _END)


def test_alone_beside_then_alone_again_each_on_prompts_of_its_own() -> None:
    again = _steady(_END, _END + 3, 20) + _steady(_END + 3, _END + 20, 100)
    seen, runs = _three_runs(60.0, 0.5, again)
    workloads = [load for load, _, _ in seen]
    assert [w.variant for w in workloads] == [0, 1, 2]  # other first lines each time
    assert [warmup for _, warmup, _ in seen] == [True, True, False]  # the third starts at once
    assert [statuses for _, _, statuses in seen] == [[], [psutil.STATUS_RUNNING], []]  # spinning beside only
    assert _busy_children() == []
    alone, beside, again_report, ratios = runs.alone, runs.beside, runs.again, runs.ratios
    assert (alone.hog, alone.after_hog, beside.hog, beside.after_hog, again_report.after_hog) == (0, 0, 1, 0, 1)
    assert (ratios.output_tokens_per_s_alone, ratios.output_tokens_per_s_beside) == (100.0, 60.0)
    assert ratios.output_tokens_per_s_again == 88.0  # 1,760 tokens over the 20 s
    assert ratios.throughput_ratio == 0.6 and ratios.ttft_p99_ratio == 2.5 and ratios.itl_p99_ratio == 1.0
    assert ratios.again_over_alone == 0.88
    assert ratios.recovery_s is not None and 2.8 <= ratios.recovery_s <= 3.0
    assert ratios.throughput_target_met and ratios.ttft_target_met and ratios.recovery_target_met
    table = markdown([alone, beside, again_report], [ratios]).splitlines()
    assert table[4].startswith("| triton-chat | closed C=16, alone again after 1 busy | 88.0 | — |")
    assert table[-1] == "| triton-chat | closed C=16 | 1 | 100.0 / 60.0 / 88.0 | 0.60 | 1.00 | 2.50 | 0.88 | 2.9 |"


def test_targets_missed_beside_a_neighbour_and_never_back() -> None:
    _, runs = _three_runs(40.0, 0.8, _steady(_END, _END + 20, 80))
    ratios = runs.ratios
    assert ratios.recovery_s is None and ratios.again_over_alone == 0.8
    assert not (ratios.throughput_target_met or ratios.ttft_target_met or ratios.recovery_target_met)
    row = markdown([runs.alone, runs.beside, runs.again], [ratios]).splitlines()[-1]
    assert row == (
        "| triton-chat | closed C=16 | 1 | 100.0 / 40.0 / 80.0 | **0.40** (missed) | 1.00 | **4.00** (missed) "
        "| 0.80 | **never** (missed) |"
    )


def test_a_run_without_warm_up_sends_only_the_timed_requests_and_logs_their_chunks() -> None:
    async def scenario() -> tuple[int, list[Arrival], float, float]:
        posts: list[int] = []
        server = await fake_chat_server(posts, 6)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        arrivals: list[Arrival] = []
        before = time.perf_counter()
        try:
            report = await run_traffic(
                url,
                "m",
                _workload(),
                requests=5,
                concurrency=2,
                timeout_s=10,
                deadline_s=30,
                warmup=False,
                arrivals=arrivals,
            )
        finally:
            server.close()
        assert report.errors == 0
        return len(posts), arrivals, before, time.perf_counter()

    posts, arrivals, before, after = asyncio.run(scenario())
    assert posts == 5  # no untimed request first
    assert len(arrivals) == 15 and sum(a.tokens for a in arrivals) == 30.0
    assert all(before <= a.at_s <= after for a in arrivals)


def test_busy_processes_end_by_themselves_after_their_limit() -> None:
    with CpuHog(1, limit_s=0.5) as hog:
        (pid,) = hog.pids
        psutil.Process(pid).wait(timeout=30)
        assert hog.pids == []
