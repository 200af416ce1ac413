"""The router-overhead benchmark's command, end to end on the tiny model: replicas, router, ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_router_overhead_benchmark_reports_both_paths_and_their_ratios(tiny_model_dir: Path) -> None:
    command = [
        sys.executable, "-m", "benchmarks.router_overhead", "--model", str(tiny_model_dir), "--dtype", "float32",
        "--replicas", "2", "-c", "2", "-n", "4", "--rounds", "1",
        "--input-len", "24", "--input-range", "8", "--output-len", "6", "--output-range", "2",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    *runs, result = (json.loads(line) for line in done.stdout.strip().splitlines())
    assert sorted(r["label"] for r in runs) == ["direct", "router"]
    assert all(r["errors"] == 0 and r["requests"] == 4 for r in runs), runs
    # Each run had prompts of its own: no run is served from another's prefix cache.
    assert len({r["workload"]["variant"] for r in runs}) == 2
    assert (result["rounds"], result["replicas"], result["concurrency"]) == (1, 2, 2)
    assert result["errors_direct"] == result["errors_router"] == 0
    direct, router = sorted(runs, key=lambda r: r["label"])
    assert result["ratios"]["ttft_p50_ms"] == round(router["ttft_p50_ms"] / direct["ttft_p50_ms"], 3)
    assert result["overhead_percent"]["ttft_p50_ms"] == round(100 * (result["ratios"]["ttft_p50_ms"] - 1), 1)
