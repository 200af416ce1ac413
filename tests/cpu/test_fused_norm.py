"""The one-pass RMSNorm kernel: transformers' RMSNorm within rounding, the residual add exactly, rows
independent of each other, and the models the lean decode step serves run it in both forwards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from python_backend.cpu.fused_norm import FusedRMSNorm, NormKernel, build_norm_kernel
from tests.fixtures.device import engine_test_device
from tests.fixtures.engine_driver import load_on_cpu
from tests.fixtures.native import built_or_skip


@pytest.fixture(scope="module")
def kernel() -> NormKernel:
    return built_or_skip(build_norm_kernel())


def _norms(dtype: torch.dtype, kernel: NormKernel, dim: int = 576) -> tuple[LlamaRMSNorm, FusedRMSNorm]:
    torch.manual_seed(dim)
    reference = LlamaRMSNorm(dim, eps=1e-5)
    reference.weight.data = torch.randn(dim) * 0.3 + 1.0
    reference = reference.to(dtype)
    return reference, FusedRMSNorm(reference, kernel)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_norm_and_add_match_transformers(kernel: NormKernel, dtype: torch.dtype, rows: int) -> None:
    reference, fused = _norms(dtype, kernel)
    hidden, delta = torch.randn(1, rows, 576).to(dtype), torch.randn(1, rows, 576).to(dtype)
    with torch.inference_mode():
        normed, summed = fused.add_norm(hidden, delta)
        expected = reference(hidden + delta)
        assert torch.equal(summed, hidden + delta)  # the add rounds as PyTorch's does
        assert torch.equal(normed, fused(summed))  # one pass or two, the same norm
    # Only the mean's summation order differs: one bfloat16 step at most, float32 rounding.
    tolerance = 2**-7 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(normed.float(), expected.float(), rtol=tolerance, atol=tolerance)
    assert normed.dtype == dtype and normed.shape == hidden.shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_row_is_normed_alike_alone_and_in_any_batch(kernel: NormKernel, dtype: torch.dtype) -> None:
    # Below and above the row count where the kernel splits rows over threads.
    _, fused = _norms(dtype, kernel)
    batch = torch.randn(1, 300, 576).to(dtype)
    with torch.inference_mode():
        whole = fused(batch)
        for rows in (1, 5, 64):
            assert torch.equal(fused(batch[:, :rows]), whole[:, :rows])


def test_inputs_the_kernel_does_not_take_get_transformers_norm(kernel: NormKernel) -> None:
    reference, fused = _norms(torch.float32, kernel)
    strided = torch.randn(4, 576, 3)[..., 1]  # a last dimension that is not contiguous
    with torch.inference_mode():
        assert torch.allclose(fused(strided), reference(strided), rtol=1e-5, atol=1e-5)
        half = reference.to(torch.float16)
        fused_half = FusedRMSNorm(half, kernel)
        value = torch.randn(3, 576, dtype=torch.float16)
        assert torch.equal(fused_half(value), half(value))


@pytest.mark.skipif(engine_test_device() != "cpu", reason="the norm kernel is a CPU path")
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_served_models_run_the_kernel_in_both_forwards(family: str, tiny_model_dir: Path, tiny_llama_dir: Path) -> None:
    loaded = load_on_cpu(tiny_model_dir if family == "qwen2" else tiny_llama_dir, "float32")
    assert loaded.base_model is not None
    decoder = loaded.base_model.get_decoder()
    norms = [decoder.norm] + [
        m for layer in decoder.layers for m in (layer.input_layernorm, layer.post_attention_layernorm)
    ]
    assert loaded.fast_decoder is not None
    assert all(type(m) is FusedRMSNorm for m in norms)
    # Turned off with the other C kernels, and kept out of the batch-invariant mode's model.
    for unchanged in (
        load_on_cpu(tiny_model_dir, "float32", cpu_native_attention=False),
        load_on_cpu(tiny_model_dir, "float32", batch_invariant=True),
    ):
        assert unchanged.base_model is not None
        assert type(unchanged.base_model.get_decoder().norm) is not FusedRMSNorm
