"""The one-call decode layers (python_backend/cpu/decode_stack.py): bit for bit the lean step's
logits and cache, padded rows and biases included, for bfloat16 models (our bfloat16 or int8
products) and float32 ones (int8 products), built only where every part is native."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import cast

import pytest
import torch

from python_backend.cpu.bf16_gemm import build_bf16_gemm
from python_backend.cpu.decode_stack import CacheLayer
from python_backend.cpu.fast_decode import FastDecoder
from python_backend.cpu.int8_gemm import Int8Gemm
from python_backend.cpu.rotary_table import tabulable
from python_backend.cpu.silu import build_silu_kernel
from python_backend.engine.batch_cache import GrowableLayer
from python_backend.engine.kv_cache import KVBatch
from python_backend.model.loader import LoadedModel
from tests.fixtures.engine_driver import copy_batch, load_on_cpu, running_batch
from tests.fixtures.quantized_models import build_quantized

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def bf16_kernels() -> None:
    if build_bf16_gemm() is None or build_silu_kernel(torch.bfloat16) is None:
        pytest.skip("no C compiler, no AVX512-BF16, or an AMX CPU: bfloat16 decode steps keep the lean step")


@pytest.fixture(scope="module")
def f32_silu() -> None:
    if build_silu_kernel(torch.float32) is None:
        pytest.skip("no C compiler or no AVX2 with FMA: float32 models keep PyTorch's SiLU")


def _stepped(
    fast: FastDecoder, kv: KVBatch, tokens: list[list[int]], prompts: list[list[int]], step: int
) -> torch.Tensor:
    ids = torch.tensor(tokens)
    positions = torch.tensor([[len(p) + step] for p in prompts])
    return fast.logits(ids, positions, kv.cache, kv.attention_mask(1, CPU).bool())


def _assert_stack_is_the_lean_step(loaded: LoadedModel, prompts: list[list[int]], steps: int) -> None:
    """Consecutive decode steps through the stack and through the lean step, from one running
    batch: equal logits, and equal caches (each step reads what the last one wrote)."""
    fast = loaded.fast_decoder
    assert fast is not None and fast.stack is not None
    stacked_kv = running_batch(loaded, prompts, loaded.kv_dtype)
    lean_kv = copy_batch(stacked_kv)
    stack, tokens = fast.stack, [[11 + i] for i in range(len(prompts))]
    with torch.inference_mode():
        for step in range(steps):
            got = _stepped(fast, stacked_kv, tokens, prompts, step)
            fast.stack = None
            try:
                expected = _stepped(fast, lean_kv, tokens, prompts, step)
            finally:
                fast.stack = stack
            assert torch.equal(got, expected)
            for (keys, values), (lean_keys, lean_values) in zip(
                stacked_kv.cache.layer_states(), lean_kv.cache.layer_states(), strict=True
            ):
                assert torch.equal(keys, lean_keys) and torch.equal(values, lean_values)
            tokens = got.argmax(-1, keepdim=True).tolist()


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # qwen2's q/k/v have biases
@pytest.mark.parametrize("rows", [1, 3])
def test_the_stack_gives_the_lean_steps_logits_and_cache(
    family: str, rows: int, bf16_kernels: None, tiny_model_dir: Path, tiny_llama_dir: Path
) -> None:
    loaded = load_on_cpu(tiny_model_dir if family == "qwen2" else tiny_llama_dir, "bfloat16")
    # The embedding, final norm and head (our bfloat16 kernel's) run in the same call.
    assert _stack_of(loaded).ends is not None  # type: ignore[attr-defined]
    prompts = [list(range(3, 40)), list(range(50, 61)), list(range(7, 30, 2))][:rows]
    _assert_stack_is_the_lean_step(loaded, prompts, steps=4)


@pytest.mark.parametrize("quantize_lm_head", [False, True])
def test_w8a8_layers_with_either_head_run_whole_steps_as_the_lean_step(
    quantize_lm_head: bool, bf16_kernels: None, int8_gemm: Int8Gemm, tiny_model_dir: Path
) -> None:
    # int8 layers with the bfloat16 head (our bfloat16 kernel's) or an int8 one: both kernels'
    # products in one call.
    loaded = load_on_cpu(tiny_model_dir, "bfloat16", quantization="int8", quantize_lm_head=quantize_lm_head)
    stack = _stack_of(loaded)
    assert stack is not None and stack.ends is not None  # type: ignore[attr-defined]
    assert stack.ends.head.int8 is quantize_lm_head  # type: ignore[attr-defined]
    _assert_stack_is_the_lean_step(loaded, [list(range(3, 40)), list(range(50, 61))], steps=3)


def test_a_length_dependent_rotary_embedding_runs_whole_steps_from_its_own_rows(
    bf16_kernels: None, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    # A dynamic rope is not tabulated: the step reads the module's rows for its own positions.
    folder = tmp_path / "dynamic-rope"
    shutil.copytree(tiny_llama_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_on_cpu(folder, "bfloat16")
    assert not tabulable(loaded.transformers_model.get_decoder().rotary_emb)
    assert _stack_of(loaded).ends is not None  # type: ignore[attr-defined]
    _assert_stack_is_the_lean_step(loaded, [list(range(3, 40)), list(range(50, 61))], steps=3)


def test_a_token_outside_the_embedding_is_refused(bf16_kernels: None, tiny_model_dir: Path) -> None:
    loaded = load_on_cpu(tiny_model_dir, "bfloat16")
    fast = loaded.fast_decoder
    assert fast is not None and fast.stack is not None and fast.stack.ends is not None
    kv = running_batch(loaded, [list(range(3, 20))], loaded.kv_dtype)
    outside = fast.stack.ends.embedding.shape[0]
    with torch.inference_mode(), pytest.raises(ValueError, match="outside the input embedding"):
        fast.logits(torch.tensor([[outside]]), torch.tensor([[17]]), kv.cache, None)


def test_steps_past_the_caches_first_buffer_read_the_grown_one(bf16_kernels: None, tiny_model_dir: Path) -> None:
    # The stack keeps each layer's cache addresses while its buffer stays; 80 steps of a 37-token
    # prompt outgrow the first buffer (a new one, its window moved), and every step still equals
    # the lean step's, cache included.
    loaded = load_on_cpu(tiny_model_dir, "bfloat16")
    keys = cast(GrowableLayer, running_batch(loaded, [list(range(3, 40))], loaded.kv_dtype).cache.layers[0]).keys
    assert keys is not None
    positions = keys.untyped_storage().nbytes() // (keys.shape[0] * keys.shape[1] * keys.shape[3] * keys.element_size())
    assert positions < 37 + 80  # the first buffer's room
    _assert_stack_is_the_lean_step(loaded, [list(range(3, 40))], steps=80)


def test_a_cache_layer_out_of_step_fails_the_step(bf16_kernels: None, tiny_model_dir: Path) -> None:
    loaded = load_on_cpu(tiny_model_dir, "bfloat16")
    fast = loaded.fast_decoder
    assert fast is not None and fast.stack is not None
    kv = running_batch(loaded, [list(range(3, 20))], loaded.kv_dtype)
    layers = cast(list[CacheLayer], kv.cache.layers)
    layers[1].append_position(torch.empty(1, fast.stack.shape.kv_heads, 1, fast.stack.shape.head_dim))
    with torch.inference_mode(), pytest.raises(RuntimeError, match="cache layer 1 out of step"):
        fast.logits(torch.tensor([[4]]), torch.tensor([[17]]), kv.cache, None)


def test_a_keep_mask_of_another_length_is_refused(bf16_kernels: None, tiny_model_dir: Path) -> None:
    loaded = load_on_cpu(tiny_model_dir, "bfloat16")
    fast = loaded.fast_decoder
    assert fast is not None and fast.stack is not None
    kv = running_batch(loaded, [list(range(3, 20)), list(range(5, 9))], loaded.kv_dtype)
    short = kv.attention_mask(1, CPU).bool()[:, 1:]
    with torch.inference_mode(), pytest.raises(ValueError, match="keep mask of shape"):
        fast.logits(torch.tensor([[4], [5]]), torch.tensor([[17], [4]]), kv.cache, short)


@pytest.mark.parametrize("kind", ["w8a8", "w8a8-static", "int8"])
def test_w8a8_layers_run_in_the_stack_as_in_the_lean_step(
    kind: str, bf16_kernels: None, int8_gemm: Int8Gemm, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # W8A8 products on our int8 kernel: dynamic per-row scales, a checkpoint's static scale, and
    # a 16-bit folder quantized at load time.
    if kind == "int8":
        loaded = load_on_cpu(tiny_model_dir, "bfloat16", quantization="int8")
    else:
        loaded = load_on_cpu(build_quantized(tiny_model_dir, tmp_path, kind), "bfloat16")
    # Their gate/up products end in SiLU, in the stack and in the lean step alike.
    mlps = [layer.mlp for layer in loaded.transformers_model.get_decoder().layers]
    assert all(mlp.gate_proj.group.ends_in_silu for mlp in mlps)
    _assert_stack_is_the_lean_step(loaded, [list(range(3, 40)), list(range(50, 61))], steps=3)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("kind", ["w8a8", "int8"])
def test_a_float32_models_w8a8_layers_run_in_the_stack_as_in_the_lean_step(
    family: str, kind: str, f32_silu: None, int8_gemm: Int8Gemm, tiny_model_dir: Path, tiny_llama_dir: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    # What an AVX2-only CPU serves fastest: float32 rows (no bfloat16 kernels there) on our int8
    # kernel's AVX2 build; on AVX-512 CPUs the same stack takes float32 rows through the VNNI build.
    # A float32 cache here (``model``); auto's bfloat16 one is the test below's.
    folder = tiny_model_dir if family == "qwen2" else tiny_llama_dir
    if kind == "int8":
        loaded = load_on_cpu(folder, "float32", quantization="int8", kv_cache_dtype="model")
    else:
        loaded = load_on_cpu(build_quantized(folder, tmp_path, kind), "float32", kv_cache_dtype="model")
    assert loaded.dtype == torch.float32 and loaded.kv_dtype is None
    _assert_stack_is_the_lean_step(loaded, [list(range(3, 40)), list(range(50, 61)), list(range(7, 30, 2))], steps=3)
    _assert_stack_is_the_lean_step(loaded, [list(range(9, 33))], steps=3)


def _stack_of(loaded: LoadedModel) -> object:
    fast = loaded.fast_decoder
    return fast.stack if fast is not None else None


def test_no_stack_where_a_part_is_not_native(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Float32 products are oneDNN's, which the stack does not call.
    assert _stack_of(load_on_cpu(tiny_model_dir, "float32")) is None
    assert _stack_of(load_on_cpu(tiny_model_dir, "float32", batch_invariant=True)) is None
    # Weight-only int8 runs PyTorch's kernel, which the stack does not call.
    assert _stack_of(load_on_cpu(build_quantized(tiny_model_dir, tmp_path, "w8a16"), "float32")) is None


@pytest.mark.parametrize("kind", ["int8", "w8a8"])
def test_a_bfloat16_cache_under_a_float32_model_runs_in_the_stack_as_in_the_lean_step(
    kind: str, f32_silu: None, int8_gemm: Int8Gemm, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # --kv-cache-dtype bfloat16 under float32 rows: the stack rounds each new key and value into
    # the cache as the lean step's copy does, so both read the same bfloat16 cache.
    if kind == "int8":
        loaded = load_on_cpu(tiny_model_dir, "float32", quantization="int8", kv_cache_dtype="bfloat16")
    else:
        loaded = load_on_cpu(build_quantized(tiny_model_dir, tmp_path, kind), "float32", kv_cache_dtype="bfloat16")
    assert loaded.kv_dtype == torch.bfloat16
    fast = loaded.fast_decoder
    assert fast is not None and fast.stack is not None
    kv = running_batch(loaded, [list(range(3, 20))], loaded.kv_dtype)
    assert fast.stack.takes(torch.zeros(1, fast.stack.shape.hidden), kv.cache.layers)
    _assert_stack_is_the_lean_step(loaded, [list(range(3, 40)), list(range(50, 61)), list(range(7, 30, 2))], steps=3)


def test_a_cache_of_another_dtype_keeps_the_lean_step(
    f32_silu: None, int8_gemm: Int8Gemm, tiny_model_dir: Path
) -> None:
    # A float16 cache under float32 rows has no kernel of the stack's: the loop's step runs it.
    loaded = load_on_cpu(tiny_model_dir, "float32", quantization="int8")
    fast = loaded.fast_decoder
    assert fast is not None and fast.stack is not None
    prompts = [list(range(3, 20)), list(range(5, 9))]
    kv = running_batch(loaded, prompts, torch.float16)
    assert not fast.stack.takes(torch.zeros(2, fast.stack.shape.hidden), kv.cache.layers)
    with pytest.raises(ValueError, match="float16 cache under torch.float32 rows"):
        fast.stack.run(
            torch.zeros(2, fast.stack.shape.hidden),
            torch.zeros(2, fast.stack.shape.head_dim),
            torch.zeros(2, fast.stack.shape.head_dim),
            None,
            cast("list[CacheLayer]", kv.cache.layers),
        )
