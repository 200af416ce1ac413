"""The realistic-traffic benchmark's command against the real served path: it reports what ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import TritonHandle

ROOT = Path(__file__).resolve().parents[2]


def test_traffic_benchmark_reports_distinct_prompt_figures(frontend_url: str, triton_server: TritonHandle) -> None:
    command = [
        sys.executable, "-m", "benchmarks.traffic", "--base-url", f"{frontend_url}/v1",
        "--model", triton_server.served_model_name, "--mix", "distinct", "-c", "2", "-n", "4",
        "--input-len", "24", "--input-range", "8", "--output-len", "6", "--output-range", "2",
        "--timeout", "120", "--deadline", "300",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["errors"] == 0, report["error_samples"]
    assert report["requests"] == 4
    assert report["arrivals"] == "closed C=2"
    # The server counted prompts of about the words sent (plus the chat template and first line).
    assert 20 < report["prompt_tokens_mean"] < 200
    assert report["output_tokens_per_s"] > 0 and report["total_tokens_per_s"] > report["output_tokens_per_s"]
    assert report["workload"]["mix"] == "distinct"


def test_traffic_benchmark_beside_a_busy_process_reports_three_runs_and_their_ratios(
    frontend_url: str, triton_server: TritonHandle
) -> None:
    command = [
        sys.executable, "-m", "benchmarks.traffic", "--base-url", f"{frontend_url}/v1",
        "--model", triton_server.served_model_name, "-c", "2", "-n", "4",
        "--input-len", "24", "--input-range", "8", "--output-len", "6", "--output-range", "2",
        "--timeout", "120", "--deadline", "300", "--hog", "1",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=800, check=False)
    assert done.returncode == 0, done.stderr
    alone, beside, again, ratios = (json.loads(line) for line in done.stdout.strip().splitlines()[-4:])
    assert (alone["hog"], beside["hog"], again["hog"], again["after_hog"], ratios["hog"]) == (0, 1, 0, 1, 1)
    assert alone["errors"] == beside["errors"] == again["errors"] == 0
    # Other prompts each run: nothing served from an earlier run's cache.
    assert (beside["workload"]["variant"], again["workload"]["variant"]) == (1, 2)
    assert ratios["throughput_ratio"] == round(beside["output_tokens_per_s"] / alone["output_tokens_per_s"], 3)
    assert ratios["again_over_alone"] == round(again["output_tokens_per_s"] / alone["output_tokens_per_s"], 3)
    assert ratios["throughput_ratio"] > 0 and ratios["itl_p99_ratio"] > 0 and ratios["ttft_p99_ratio"] > 0
    # How soon it came back depends on the machine; that it is reported, and judged, does not.
    assert ratios["recovery_s"] is None or ratios["recovery_s"] >= 0
    assert ratios["recovery_target_met"] == (ratios["recovery_s"] is not None and ratios["recovery_s"] <= 10)
