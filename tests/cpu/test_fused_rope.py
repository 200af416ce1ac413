"""The one-pass rotary-embedding kernel gives PyTorch's rotation bit for bit, in the lean decode
step's layout, and leaves other layouts to PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.models.llama.modeling_llama import rotate_half

from python_backend.cpu.fused_rope import RopeKernel, build_rope_kernel
from tests.fixtures.device import engine_test_device
from tests.fixtures.engine_driver import load_on_cpu
from tests.fixtures.native import built_or_skip


@pytest.fixture(scope="module")
def kernel() -> RopeKernel:
    return built_or_skip(build_rope_kernel())


def _step(tokens: int, heads: int, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query and key heads as the lean step has them (a view into the merged q/k/v product), and
    cos/sin of positions spread over a long context."""
    torch.manual_seed(tokens * dim + heads)
    merged = torch.randn(1, tokens, heads * dim + 2 * dim).to(dtype)  # + a value head's width
    query_key = merged[..., : heads * dim].view(1, tokens, heads, dim)
    positions = torch.randint(0, 30000, (tokens,)).float()
    frequencies = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.cat([positions[:, None] * frequencies] * 2, dim=-1)
    return query_key, angles.cos().to(dtype)[None, :, None], angles.sin().to(dtype)[None, :, None]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("tokens", "heads", "dim"), [(1, 12, 64), (64, 12, 64), (300, 18, 64), (7, 6, 128), (5, 3, 80)]
)
def test_rotation_equals_pytorch_bitwise(
    kernel: RopeKernel, dtype: torch.dtype, tokens: int, heads: int, dim: int
) -> None:
    query_key, cos, sin = _step(tokens, heads, dim, dtype)
    assert kernel.handles(query_key, cos, sin)
    expected = (query_key * cos) + (rotate_half(query_key) * sin)
    got = kernel.rotate(query_key, cos, sin)
    assert got.dtype == dtype and got.shape == expected.shape
    assert torch.equal(got, expected)


def test_other_layouts_are_left_to_pytorch(kernel: RopeKernel) -> None:
    query_key, cos, sin = _step(8, 4, 64, torch.float32)
    assert not kernel.handles(query_key.transpose(1, 2), cos, sin)  # heads before tokens
    assert not kernel.handles(query_key, cos.expand(1, 8, 4, 64), sin)  # one cos per head
    assert not kernel.handles(query_key.half(), cos.half(), sin.half())


@pytest.mark.skipif(engine_test_device() != "cpu", reason="the rotary kernel is a CPU path")
def test_the_lean_step_of_a_served_model_uses_it(tiny_model_dir: Path) -> None:
    loaded = load_on_cpu(tiny_model_dir, "float32")
    assert loaded.fast_decoder is not None and loaded.fast_decoder.rotates_natively
    without = load_on_cpu(tiny_model_dir, "float32", cpu_native_attention=False).fast_decoder
    assert without is not None and not without.rotates_natively
