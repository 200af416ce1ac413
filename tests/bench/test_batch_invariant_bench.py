"""The batch-invariant benchmark's command on the tiny model: both modes run, and the mode's answers
are the same at every concurrency."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_reports_both_modes_and_no_difference_with_the_mode_on(tiny_llama_dir: Path) -> None:
    command = [
        sys.executable, "-m", "benchmarks.batch_invariant", "--model", str(tiny_llama_dir), "--dtype", "bfloat16",
        "--concurrency", "1,4", "--requests", "6", "--input-len", "20", "--input-range", "10",
        "--output-len", "12", "--output-range", "4",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    runs = [line for line in lines if "output_tokens_per_s" in line]
    assert [(r["batch_invariant"], r["concurrency"]) for r in runs] == [(False, 1), (False, 4), (True, 1), (True, 4)]
    assert all(r["requests"] == 6 and r["output_tokens"] >= 6 * 8 and r["output_tokens_per_s"] > 0 for r in runs)
    summaries = {line["batch_invariant"]: line for line in lines if "differ" in line}
    assert summaries[True]["differ"] == 0 and summaries[True]["of"] == 6
    assert summaries[False]["of"] == 6  # without the mode, any count: it depends on this CPU's kernels
