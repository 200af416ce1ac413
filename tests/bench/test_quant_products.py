"""benchmarks/quant_products.py's ``--head``: the output head of the model's config, timed once a pass
in each form asked for, printed as a table against the float form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import quant_products


def test_head_times_the_output_head_of_the_configs_shape(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text(encoding="utf-8"))
    quant_products.main(
        ["--model", str(tiny_model_dir), "--head", "--forms", "f32,w8a8", "--rows", "1,4", "--dtype", "float32",
         "--warmup", "0", "--repeats", "2"]
    )  # fmt: skip
    out = capsys.readouterr().out
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["form"], r["rows"]) for r in records] == [("f32", 1), ("f32", 4), ("w8a8", 1), ("w8a8", 4)]
    assert all(r["ms_per_pass"] > 0 for r in records)
    # One product a pass, vocabulary by hidden width, each quantized row set against float32's.
    assert f"(head {config['vocab_size']}x{config['hidden_size']})" in out
    assert "time over f32's" in out
    w8a8_row = next(line for line in out.splitlines() if line.startswith("w8a8 "))
    assert w8a8_row.count("x)") == 2
