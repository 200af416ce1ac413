"""The soak's fast tier, with disconnects under load: mixed traffic through the real launcher
(60 % streams, 30 % whole answers, 10 % clients that leave mid-stream, 5 % invalid requests) for
two minutes after a warm-up, then the checks a user's operator would make: every answer as
expected, memory, open files and threads not growing, no slot left taken, nothing left behind.
The slow tier is the same run for 20 minutes: ``python -m benchmarks.soak --duration 1200``."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak import run_soak
from benchmarks.soak_traffic import INVALID, LEAVE, STREAM, WHOLE


@pytest.mark.slow
def test_two_minutes_of_mixed_traffic_leave_nothing_behind(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A prefix cache small enough to fill during the warm-up, so that the soak also churns its
    # evictions (a leak there would show as growth).
    cache = ("--prefix-cache-memory-mb", "8")
    report = run_soak(str(tiny_model_dir), "float32", 120.0, 30.0, 8, tmp_path / "server.log", server_args=cache)
    sent = report.soak.sent
    assert all(sent.get(kind, 0) > 0 for kind in (STREAM, WHOLE, LEAVE, INVALID)), sent
    assert sum(sent.values()) > 200, sent  # the load really ran
    assert report.verdict == dict.fromkeys(report.verdict, True), report.to_json()
    assert set(report.verdict) >= {"no_unexpected_answers", "rss_growth_within_5_percent", "no_leaked_slots"}
