"""benchmarks/engine_ab.py on the tiny model: every variant runs every round, in alternating order,
and the summary gives each variant's ratio to the reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _command(model: Path, *variants: str) -> list[str]:
    command = [
        sys.executable, "-m", "benchmarks.engine_ab", "--model", str(model), "--dtype", "float32",
        "-c", "2", "-n", "3", "--rounds", "2", "--input-len", "20", "--input-range", "10",
        "--output-len", "10", "--output-range", "4",
    ]  # fmt: skip
    for variant in variants:
        command += ["--variant", variant]
    return command


def test_two_variants_alternate_and_compare(tiny_model_dir: Path) -> None:
    command = _command(tiny_model_dir, "auto:kv_cache_dtype=auto", "bf16kv:kv_cache_dtype=bfloat16")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    runs = [line for line in lines if "variant" in line]
    assert [(r["variant"], r["round"]) for r in runs] == [("auto", 0), ("bf16kv", 0), ("bf16kv", 1), ("auto", 1)]
    assert all(r["requests"] == 3 and r["output_tokens"] >= 3 * 6 and r["output_tokens_per_s"] > 0 for r in runs)
    assert all(r["ttft_ms_p50"] <= r["ttft_ms_p99"] and r["itl_ms_p50"] <= r["itl_ms_p99"] for r in runs)
    (summary,) = [line for line in lines if "ratio" in line]
    assert summary["reference"] == "auto" and summary["ratio"]["auto"] == 1.0
    assert summary["ratio"]["bf16kv"] > 0
    assert summary["answers_differing_from_reference"]["auto"] == 0
    assert set(summary["median_output_tokens_per_s"]) == {"auto", "bf16kv"}


def test_a_variant_with_an_unknown_setting_is_refused(tiny_model_dir: Path) -> None:
    command = _command(tiny_model_dir, "a:", "b:no_such_setting=1")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode != 0
    assert "unknown model parameter 'no_such_setting'" in done.stderr
