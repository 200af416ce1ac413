"""The batch-invariant mode's kernels: a row's (a query's) result does not depend on its company.

These rely only on "the same kernel on the same shape gives the same result": the tiled products
always have one shape, and the attention kernel's order of additions is fixed by each query's
own keys, so the checks hold on any x86 CPU (AVX2, AVX-512, AMX).
"""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from python_backend.cpu.batch_invariant import (
    ROW_TILE,
    UnsupportedAttention,
    install_batch_invariant,
    invariant_attention,
)
from python_backend.cpu.fused_projections import FusedProjections
from python_backend.cpu.linear import PackedLinear, prepack_supported
from python_backend.cpu.native.invariant_attention import InvariantAttentionKernel, build_invariant_kernel
from python_backend.cpu.row_tiles import TiledLinear, row_tiled
from tests.fixtures.native import built_or_skip
from tests.fixtures.onednn import BF16_PACK_SKIP

DTYPES = [torch.float32, torch.bfloat16]
# Each dtype with grouped-query, many-head and one-key-per-head attention (heads, kv_heads, dim).
_ATTENTION_CASES = pytest.mark.parametrize(
    ("dtype", "heads", "kv_heads", "dim"),
    [(dtype, *shape) for dtype in DTYPES for shape in [(4, 2, 16), (9, 3, 64), (6, 6, 24)]],
)
ONEDNN = pytest.mark.skipif(
    not prepack_supported(torch.device("cpu"), torch.float32), reason="this torch build has no oneDNN linear"
)


@pytest.fixture(scope="module")
def kernel() -> InvariantAttentionKernel:
    return built_or_skip(build_invariant_kernel())


def _row_everywhere(product: torch.nn.Module, row: torch.Tensor, width: int) -> list[torch.Tensor]:
    """``row``'s output alone and at several places among 1 to 70 other rows."""
    outs = []
    for count, place in [(1, 0), (2, 1), (5, 3), (16, 15), (17, 16), (31, 7), (40, 39), (70, 33)]:
        batch = torch.randn(count, width).to(row.dtype)
        batch[place] = row
        outs.append(product(batch)[place])
    return outs


def _products(dtype: torch.dtype) -> list[tuple[str, torch.nn.Module]]:
    torch.manual_seed(1)
    linear = torch.nn.Linear(96, 80).to(dtype)
    products: list[tuple[str, torch.nn.Module]] = [("nn.Linear", TiledLinear(linear, ROW_TILE))]
    if prepack_supported(torch.device("cpu"), dtype):
        packed = PackedLinear(linear)
        packed.row_tile = ROW_TILE
        fused = FusedProjections([linear, torch.nn.Linear(96, 32).to(dtype)])
        fused.row_tile = ROW_TILE
        products += [("prepacked", packed), ("merged", _Apply(fused))]
    return products


class _Apply(torch.nn.Module):
    def __init__(self, fused: FusedProjections) -> None:
        super().__init__()
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.apply_unchecked(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_of_a_tiled_product_is_the_same_in_any_batch_and_place(dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    row = torch.randn(96).to(dtype)
    for name, product in _products(dtype):
        outs = _row_everywhere(product, row, 96)
        for out in outs[1:]:
            assert torch.equal(out, outs[0]), name


def test_row_tiled_keeps_the_leading_shape_and_matches_the_plain_product() -> None:
    torch.manual_seed(3)
    weight = torch.randn(24, 40)
    x = torch.randn(3, 21, 40)
    got = row_tiled(lambda t: t @ weight.T, x, ROW_TILE)
    assert got.shape == (3, 21, 24)
    assert torch.allclose(got, x @ weight.T, atol=1e-5)


@ONEDNN
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=BF16_PACK_SKIP)])
def test_install_tiles_every_product_of_the_decoder_and_head(dtype: torch.dtype) -> None:
    from python_backend.cpu.linear import pack_linears

    decoder = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(dtype)
    head = torch.nn.Linear(8, 4).to(dtype)
    other = torch.nn.Linear(8, 8).to(dtype)
    model = torch.nn.ModuleDict({"decoder": decoder, "head": head, "other": other})
    pack_linears(model, decoder, None)  # the head stays a plain nn.Linear
    assert install_batch_invariant(model, decoder, head) == 3
    assert all(isinstance(m, PackedLinear) and m.row_tile == ROW_TILE for m in decoder)
    assert type(model["head"]) is TiledLinear and model["head"].weight is head.weight
    assert type(model["other"]) is torch.nn.Linear  # outside the decoder and head: left alone


class _Module(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


def _qkv(length: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    q = torch.randn(1, heads, length, dim).to(dtype)
    k = torch.randn(1, kv_heads, length, dim).to(dtype)
    v = torch.randn(1, kv_heads, length, dim).to(dtype)
    return q, k, v


@_ATTENTION_CASES
def test_attention_equals_sdpa_in_value(
    kernel: InvariantAttentionKernel, dtype: torch.dtype, heads: int, kv_heads: int, dim: int
) -> None:
    torch.manual_seed(4)
    q, k, v = _qkv(29, heads, kv_heads, dim, dtype)
    module = _Module(heads // kv_heads)
    got, _ = invariant_attention(module, q, k, v, None, scaling=0.3, kernel=kernel)
    expected, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), None, scaling=0.3)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert got.shape == expected.shape == (1, 29, heads, dim)
    assert torch.allclose(got.float(), expected, atol=tolerance, rtol=tolerance)


@_ATTENTION_CASES
def test_a_query_attends_the_same_in_prefill_in_chunks_in_decode_and_in_a_padded_batch(
    kernel: InvariantAttentionKernel, dtype: torch.dtype, heads: int, kv_heads: int, dim: int
) -> None:
    torch.manual_seed(5)
    length = 37
    q, k, v = _qkv(length, heads, kv_heads, dim, dtype)
    prefill = kernel.attend(q, k, v, None, 0.25)  # [1, length, heads, dim], causal
    for position in (0, 15, 16, length - 1):
        keys, values = k[:, :, : position + 1], v[:, :, : position + 1]
        decoded = kernel.attend(q[:, :, position : position + 1], keys, values, None, 0.25)
        assert torch.equal(decoded[0, 0], prefill[0, position])
        chunk = kernel.attend(q[:, :, 3 : position + 1], keys, values, None, 0.25) if position >= 3 else None
        if chunk is not None:
            assert torch.equal(chunk[0, -1], prefill[0, position])
    # Left-padded among two other sequences, a longer and a shorter one, with a boolean mask.
    pad = 11
    total = length + pad
    other_q, other_k, other_v = _qkv(total, heads, kv_heads, dim, dtype)
    batch_q = torch.cat([other_q, torch.cat([torch.zeros_like(q[:, :, :pad]), q], dim=2), other_q.flip(2)])
    batch_k = torch.cat([other_k, torch.cat([torch.zeros_like(k[:, :, :pad]), k], dim=2), other_k])
    batch_v = torch.cat([other_v, torch.cat([torch.zeros_like(v[:, :, :pad]), v], dim=2), other_v])
    mask = torch.ones(3, total, total, dtype=torch.bool).tril()
    mask[1, :, :pad] = False
    mask[2, :, :20] = False
    batched = kernel.attend(batch_q.contiguous(), batch_k, batch_v, mask, 0.25)
    assert torch.equal(batched[1, pad:], prefill[0])


def test_attention_refuses_what_it_does_not_compute(kernel: InvariantAttentionKernel) -> None:
    q, k, v = _qkv(5, 4, 2, 16, torch.float32)
    module = _Module(2)
    with pytest.raises(UnsupportedAttention, match="softcap"):
        invariant_attention(module, q, k, v, None, kernel=kernel, softcap=30.0)
    with pytest.raises(UnsupportedAttention, match="boolean"):
        invariant_attention(module, q, k, v, torch.zeros(1, 1, 5, 5), kernel=kernel)
