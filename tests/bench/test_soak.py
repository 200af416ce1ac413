"""The soak's memory figures: processes found by role, peaks under load, growth per 10 minutes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from benchmarks.soak import SoakReport
from benchmarks.soak_memory import MIB, PeakRss, ProcessSample, RssTrend, served_processes
from benchmarks.soak_traffic import Tally
from openai_frontend.launcher.tritonserver import STUB_NAME

FIND_TIMEOUT_S = 10.0


def _sample(pid: int, mib: float, cache_mib: float = 0.0) -> ProcessSample:
    return ProcessSample(pid, int(mib * MIB), 10, 4, int(cache_mib * MIB))


def _samples(launcher: float, triton: float, stub: float, cache: float = 0.0) -> dict[str, ProcessSample]:
    return {"launcher": _sample(1, launcher), "tritonserver": _sample(2, triton), "stub": _sample(3, stub, cache)}


def test_growth_per_10_minutes_over_the_soak_and_its_second_half() -> None:
    trend = RssTrend()
    # A frontend that warms up (fast, then flat) and a process that leaks 3 MiB every 5 minutes.
    for minute, launcher, stub in ((0, 92.0, 300.0), (10, 98.0, 306.0), (20, 100.0, 312.0), (30, 100.0, 318.0)):
        trend.add(minute * 60.0, _samples(launcher, 180.0, stub))
    assert trend.per_10min() == {"launcher": 2.67, "tritonserver": 0.0, "stub": 6.0}
    assert trend.per_10min(second_half=True) == {"launcher": 1.0, "tritonserver": 0.0, "stub": 6.0}


def test_growth_leaves_out_the_prefix_cache_filling_to_its_budget() -> None:
    trend = RssTrend()
    trend.add(0.0, _samples(92.0, 180.0, 300.0, cache=10.0))
    trend.add(300.0, _samples(92.0, 180.0, 364.0, cache=74.0))
    assert trend.per_10min()["stub"] == 0.0
    assert trend.mib["stub"] == [300.0, 364.0]


def test_one_checkpoint_has_no_growth_rate() -> None:
    trend = RssTrend()
    trend.add(0.0, _samples(92.0, 180.0, 300.0))
    assert trend.per_10min() == {}


def test_the_report_has_each_process_at_start_after_warm_up_at_the_end_and_its_peak() -> None:
    trend = RssTrend()
    trend.add(0.0, _samples(95.0, 180.0, 310.0))
    trend.add(600.0, _samples(96.0, 180.0, 311.0))
    report = SoakReport(
        "DIR", 8, 60.0, 600.0, Tally(), Tally(), _samples(95.0, 180.0, 310.0), _samples(96.0, 180.0, 311.0),
        {}, [], _samples(80.0, 170.0, 250.0), trend, {"launcher": 99.0, "tritonserver": 181.0, "stub": 700.0},
    )  # fmt: skip
    report.judge()
    body = json.loads(report.to_json())
    assert body["rss_mib"]["stub"] == {"start": 250.0, "after_warmup": 310.0, "end": 311.0, "peak_under_load": 700.0}
    assert body["rss_mib_per_10min"] == {"launcher": 1.0, "tritonserver": 0.0, "stub": 1.0}
    assert body["verdict"]["rss_growth_within_5_percent"] is True


@pytest.fixture
def fake_server() -> Iterator[int]:
    """A process tree shaped as a served one: tritonserver and two model stubs under a launcher."""
    script = f"(exec -a tritonserver sleep 60) & (exec -a {STUB_NAME} sleep 60) & (exec -a {STUB_NAME} sleep 60) & wait"
    launcher = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        yield launcher.pid
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(10)


def _served(pid: int) -> dict[str, psutil.Process]:
    deadline = time.monotonic() + FIND_TIMEOUT_S
    while True:
        found = served_processes(pid)
        named = all(proc.cmdline()[:1] != ["sleep"] for proc in psutil.Process(pid).children())
        if (len(found) == 4 and named) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_every_model_stub_is_found_and_named_apart(fake_server: int) -> None:
    found = _served(fake_server)
    assert sorted(found) == ["launcher", "stub", "stub-2", "tritonserver"]
    assert found["stub"].pid < found["stub-2"].pid


def test_peaks_are_sampled_for_every_process_while_a_load_runs(fake_server: int) -> None:
    _served(fake_server)
    with PeakRss(fake_server, interval_s=0.05) as peak:
        peak.sample()
    assert set(peak.peaks) == {"launcher", "stub", "stub-2", "tritonserver"}
    assert all(value > 0 for value in peak.peaks.values())


def _report(trend: RssTrend) -> SoakReport:
    first = {name: _sample(i, values[0]) for i, (name, values) in enumerate(trend.mib.items())}
    last = {name: _sample(i, values[-1]) for i, (name, values) in enumerate(trend.mib.items())}
    report = SoakReport("DIR", 8, 60.0, 1800.0, Tally(), Tally(), first, last, {}, [], {}, trend)
    report.judge()
    return report


def test_a_heap_that_fills_in_the_first_minutes_passes_and_a_steady_leak_fails() -> None:
    warming, leaking = RssTrend(), RssTrend()
    # Measured shape: the model's kept heap fills to its cap in the first ten minutes, then flat.
    for minute, stub in enumerate((1046.0, 1084.3, 1113.5, 1096.3, 1101.8, 1102.1, 1102.0)):
        warming.add(minute * 300.0, _samples(94.5, 40.0, stub))
    for minute in range(7):
        leaking.add(minute * 300.0, _samples(94.5, 40.0, 1000.0 + 20.0 * minute))
    warm = _report(warming)
    assert warm.rss_growth()["stub"] > 0.05  # from the end of a one-minute warm-up
    assert warm.verdict["rss_growth_within_5_percent"] is True
    assert json.loads(warm.to_json())["rss_growth_second_half"]["stub"] == 0.0052
    assert _report(leaking).verdict["rss_growth_within_5_percent"] is False
