"""The idle benchmark's command: a served model that gets no request costs almost no CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_an_idle_server_costs_under_a_few_percent_of_a_core(tiny_model_dir: Path) -> None:
    command = [
        sys.executable, "-m", "benchmarks.idle_cpu", "--model", str(tiny_model_dir), "--settle", "2", "--seconds", "10",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    shares = json.loads(done.stdout.strip().splitlines()[-1])["idle_cpu_percent_of_one_core"]
    assert {"launcher", "stub", "tritonserver"} <= set(shares)
    # The aim is under 1 % of a core (docs/performance.md); on a busy machine each wake-up costs
    # more, so the test allows 5 %: what it catches is a loop that spins or polls fast.
    assert shares["total"] < 5.0, shares
