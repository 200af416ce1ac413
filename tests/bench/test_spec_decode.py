"""benchmarks/spec_decode.py on the tiny model: both workloads run, both modes answer alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.looping_model import build_looping_model

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_reports_both_modes_and_identical_answers(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = build_looping_model(tiny_model_dir, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "benchmarks.spec_decode", "--model", str(model),
           "--requests", "2", "--max-tokens", "24"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    runs = [line for line in lines if "mode" in line]
    assert [(r["workload"], r["mode"]) for r in runs] == [
        ("repetitive", "off"), ("repetitive", "ngram-4"), ("distinct", "off"), ("distinct", "ngram-4"),
    ]  # fmt: skip
    assert all(r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in runs)
    summaries = [line for line in lines if "speedup" in line]
    assert [s["workload"] for s in summaries] == ["repetitive", "distinct"]
    assert all(s["identical_answers"] for s in summaries)
    assert runs[1]["accepted_tokens"] > 0  # the looping model's answers copy: drafts are accepted


def test_the_benchmark_measures_a_draft_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = build_looping_model(tiny_model_dir, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "benchmarks.spec_decode", "--model", str(model), "--draft-model", str(model),
           "--tokens", "3", "--requests", "3", "--max-tokens", "24", "--workloads", "distinct",
           "--concurrency", "2"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    runs = [line for line in lines if "mode" in line]
    assert [(r["mode"], r["concurrency"], r["requests"]) for r in runs] == [("off", 2, 3), ("draft-3", 2, 3)]
    summary = next(line for line in lines if "speedup" in line)
    assert summary["identical_answers"]
    # The model drafting for itself: nearly every draft is accepted.
    assert runs[1]["accepted_tokens"] >= 0.8 * runs[1]["draft_tokens"] > 0
