"""benchmarks/products_compare.py on the tiny model: the shapes come from the checkpoint's config,
each timing is a rate, and the table sets ours against vLLM's where both ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import products_compare
from benchmarks.products_compare import Shape, Timing, model_shapes, table

ROOT = Path(__file__).resolve().parents[2]


def test_the_shapes_are_the_engine_s_fused_products(tmp_path: Path) -> None:
    config = {
        "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
        "num_hidden_layers": 30, "vocab_size": 49152,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_shapes(tmp_path) == [
        Shape("qkv", (9 + 2 * 3) * 64, 576, 30),
        Shape("o", 576, 576, 30),
        Shape("gate_up", 2 * 1536, 576, 30),
        Shape("down", 576, 1536, 30),
        Shape("head", 49152, 576, 1),
    ]


def test_the_table_takes_each_side_s_best_round_and_their_ratio() -> None:
    timings = [
        Timing("ours", 16, "steady", 12.0, 1.0),
        Timing("ours", 16, "steady", 10.0, 1.2),
        Timing("vllm", 16, "steady", 8.0, 1.5),
        Timing("ours", 1, "steady", 3.0, 0.1),
    ]
    rows = table(timings).splitlines()[2:]
    assert rows == ["| 1 | steady | 3.00 / 0 | — | — |", "| 16 | steady | 10.00 / 1 | 8.00 / 2 | 1.25 |"]


def test_ours_alone_prints_a_rate_per_row_count_and_the_churn_pass(tiny_model_dir: Path) -> None:
    command = [
        sys.executable, "-m", "benchmarks.products_compare", "--model", str(tiny_model_dir), "--rows", "1,4",
        "--churn-rows", "2,3", "--passes", "2", "--rounds", "1",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(line["impl"], line["rows"], line["mode"]) for line in lines] == [
        ("ours", 1, "steady"),
        ("ours", 4, "steady"),
        ("ours", 2, "churn"),  # the mean of the cycled row counts, rounded
    ]
    assert all(line["ms_per_pass"] > 0 and line["gflops"] > 0 for line in lines)
    assert "| 4 | steady |" in done.stdout and "| — | — |" in done.stdout  # no vLLM: no ratio


def test_each_round_reverses_which_side_runs_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    order: list[str] = []

    def run_child(python: str, impl: str, args: object) -> list[Timing]:
        order.append(impl)
        return [Timing(impl, 16, "steady", 10.0 if impl == "ours" else 8.0, 1.0)]

    monkeypatch.setattr(products_compare, "_run_child", run_child)
    products_compare.main(["--model", str(tmp_path), "--vllm-python", "/vllm/bin/python", "--rounds", "3"])
    assert order == ["ours", "vllm", "vllm", "ours", "ours", "vllm"]
