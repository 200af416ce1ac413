"""benchmarks/products_compare.py on the tiny model: the shapes come from the checkpoint's config,
each timing is a rate, the table sets ours against vLLM's where both ran and names the precision,
and a product off the float one stops a side before it is timed. vLLM is not installed here: its
side is exercised through the parent's handling only."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from benchmarks import products_compare
from benchmarks.products_compare import Shape, Timing, check_products, int8_per_channel, model_shapes, table
from python_backend.cpu.int8_gemm import build_int8_gemm
from python_backend.cpu.int8_rows import build_int8_rows_kernel
from python_backend.cpu.quant_linear import quantize_per_channel

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
    header, _, *rows = table(timings, "bfloat16").splitlines()
    assert header == "| rows | mode | ours (bfloat16) ms / GFLOP/s | vLLM (bfloat16) ms / GFLOP/s | ours ÷ vLLM |"
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


def _w8a8_kernel() -> str:
    return "int8_gemm" if build_int8_gemm() is not None else "int_mm"


def test_ours_in_w8a8_times_int8_products_and_says_so(tiny_model_dir: Path) -> None:
    if build_int8_rows_kernel() is None:
        pytest.skip("no C compiler: the W8A8 products need the C row passes")
    command = [
        sys.executable, "-m", "benchmarks.products_compare", "--model", str(tiny_model_dir), "--dtype", "bfloat16",
        "--quant", "w8a8", "--rows", "1,4", "--churn-rows", "2,3", "--passes", "2", "--rounds", "1",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(line["rows"], line["mode"], line["quant"]) for line in lines] == [
        (1, "steady", "w8a8"),
        (4, "steady", "w8a8"),
        (2, "churn", "w8a8"),
    ]
    assert {line["kernel"] for line in lines} == {f"QuantLinear {_w8a8_kernel()}"}
    assert all(line["ms_per_pass"] > 0 and line["gflops"] > 0 for line in lines)
    assert "| rows | mode | ours (W8A8 int8, head bfloat16) ms / GFLOP/s |" in done.stdout


def test_w8a8_reaches_both_children_and_heads_the_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commands: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        impl = command[command.index("--child") + 1]
        timing = Timing(impl, 16, "steady", 5.0 if impl == "ours" else 4.0, 1.0, "w8a8", "k")
        return subprocess.CompletedProcess(command, 0, json.dumps(asdict(timing)) + "\n", "")

    monkeypatch.setattr(products_compare.subprocess, "run", run)
    args = ["--model", str(tmp_path), "--dtype", "bfloat16", "--quant", "w8a8", "--vllm-python", "/vllm/bin/python"]
    products_compare.main([*args, "--rounds", "1"])
    assert [command[0] for command in commands] == [sys.executable, "/vllm/bin/python"]
    assert all(command[command.index("--quant") + 1] == "w8a8" for command in commands)
    out = capsys.readouterr().out
    assert "| ours (W8A8 int8, head bfloat16) ms / GFLOP/s | vLLM (W8A8 int8, head bfloat16) ms / GFLOP/s |" in out
    assert "| 16 | steady | 5.00 / 1 | 4.00 / 1 | 1.25 |" in out


def test_an_unknown_quant_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        products_compare.main(["--model", str(tmp_path), "--quant", "int4"])
    assert exit_.value.code == 2
    assert "--quant: invalid choice: 'int4'" in capsys.readouterr().err


def test_a_product_off_the_float_one_stops_its_side_by_name() -> None:
    weight = torch.randn(64, 32) * 0.02
    good = (lambda x: x @ weight.t(), weight)
    halved = (lambda x: 0.5 * (x @ weight.t()), weight)
    check_products("ours", [("qkv", *good)])  # passes: no exit
    with pytest.raises(SystemExit, match=r"^vllm: the down product is 50\.0% off the float product \(limit 5%\)$"):
        check_products("vllm", [("qkv", *good), ("down", *halved)])
    with pytest.raises(SystemExit, match=r"^ours: the head product gave shape \(3, 63\), not \(3, 64\)$"):
        check_products("ours", [("head", lambda x: (x @ weight.t())[:, :63], weight)])


def test_vllm_s_side_gets_the_levels_and_scales_ours_quantizes_to() -> None:
    weight = torch.randn(48, 40, dtype=torch.bfloat16)
    levels, scale = int8_per_channel(weight)
    ours = quantize_per_channel(weight)
    assert torch.equal(levels, ours.values)
    assert torch.equal(scale, ours.scale)
    assert levels.dtype == torch.int8 and scale.shape == (48, 1) and scale.dtype == torch.float32
