"""benchmarks/bandwidth_bound.py on the tiny model: the bytes a step reads come from the
checkpoint, and each variant's time per token is set against the bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from benchmarks.bandwidth_bound import StepBytes, read_buffer, step_bytes, sum_rates
from tests.fixtures.quantized_models import build_quantized

ROOT = Path(__file__).resolve().parents[2]


def test_step_bytes_count_each_weight_once_at_the_serving_width(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    config = model.config
    # parameters() yields a tied output head once, which a step reads once.
    elements = sum(p.numel() for p in model.parameters())
    if not config.tie_word_embeddings:
        embedding = model.get_input_embeddings()
        assert isinstance(embedding, torch.nn.Embedding)
        elements -= embedding.weight.numel()  # a step reads one row of it
    per_layer = 2 * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    expected = StepBytes(weights=elements * 4, kv_per_token=per_layer * config.num_hidden_layers * 4)
    assert step_bytes(tiny_model_dir, "float32", 4) == expected
    assert step_bytes(tiny_model_dir, "bfloat16", 2).weights == elements * 2


def test_int8_projections_count_one_byte_each(tiny_model_dir: Path, tmp_path: Path) -> None:
    # --quantization int8 makes the decoder's projections int8; a W8A8 folder stores them so.
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    projections = sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.split(".")[-1].endswith("_proj")
    )
    assert projections > 0
    full = step_bytes(tiny_model_dir, "float32", 4)
    made = step_bytes(tiny_model_dir, "float32", 4, "int8")
    assert full.weights - made.weights == projections * 3
    assert step_bytes(tiny_model_dir, "float32", 4, "none") == full
    folder = build_quantized(tiny_model_dir, tmp_path / "w8a8", "w8a8")
    stored = step_bytes(folder, "float32", 4)
    # The folder adds a float scale per output channel beside each int8 weight.
    assert made.weights <= stored.weights < made.weights + projections // 4


def test_an_int8_head_counts_one_byte_an_element(tiny_model_dir: Path) -> None:
    # quantize_lm_head: a step reads the head's int8 copy, not the tied float embeddings.
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    assert model.config.tie_word_embeddings
    head = model.get_output_embeddings()
    assert isinstance(head, torch.nn.Linear)
    made = step_bytes(tiny_model_dir, "float32", 4, "int8")
    both = step_bytes(tiny_model_dir, "float32", 4, "int8", head_int8=True)
    assert made.weights - both.weights == head.weight.numel() * 3
    assert both.kv_per_token == made.kv_per_token


def test_read_bandwidth_is_a_rate() -> None:
    assert max(sum_rates(read_buffer(16), 2)) > 1e8  # bytes/s: any machine reads 100 MB/s


def test_the_benchmark_reports_the_bound_and_the_ratio_per_variant(tiny_model_dir: Path) -> None:
    command = [
        sys.executable, "-m", "benchmarks.bandwidth_bound", "--model", str(tiny_model_dir), "--dtype", "float32",
        "--variant", "auto:", "--variant", "bf16kv:kv_cache_dtype=bfloat16",
        "--variant", "int8head:quantization=int8,quantize_lm_head=true", "-n", "1", "--input-len", "20",
        "--input-range", "5", "--output-len", "12", "--buffer-mb", "32",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [line["variant"] for line in lines] == ["auto", "bf16kv", "int8head"]
    auto, narrow, int8 = lines
    assert narrow["kv_bytes_per_token"] * 2 == auto["kv_bytes_per_token"]
    # W8A8 layers keep a float32 model's keys and values in bfloat16 by default.
    assert int8["kv_bytes_per_token"] == narrow["kv_bytes_per_token"]
    assert int8["weight_bytes"] < auto["weight_bytes"] / 3
    for line in lines:
        assert line["bound_ms"] > 0 and line["tpot_ms_p50"] > 0
        low, high = line["read_bandwidth_gb_s_range"]
        assert 0 < low <= line["read_bandwidth_gb_s"] <= high <= line["best_read_gb_s"]
        # One request: its ratio is against the bound from the readings on either side of it.
        assert line["ratio"] == pytest.approx(line["tpot_ms_p50"] / line["bound_ms"], rel=0.05)
        # The best sum of the run gives the smallest bound, so the larger ratio.
        at_best = line["tpot_ms_p50"] / (line["bound_ms"] * line["read_bandwidth_gb_s"] / line["best_read_gb_s"])
        assert line["ratio_at_best"] == pytest.approx(at_best, rel=0.05)
        assert line["ratio_at_best"] >= line["ratio"] * 0.95
