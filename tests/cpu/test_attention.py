"""The decode attention equals transformers' SDPA attention, with and without padding masks."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from python_backend.cpu.attention import decode_attention


class _Module(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padded", [False, True])
def test_decode_attention_matches_sdpa(dtype: torch.dtype, padded: bool) -> None:
    torch.manual_seed(0)
    batch, heads, kv_heads, length, dim = 4, 9, 3, 37, 64
    query = torch.randn(batch, heads, 1, dim, dtype=dtype)
    key = torch.randn(batch, kv_heads, length, dim, dtype=dtype)
    value = torch.randn(batch, kv_heads, length, dim, dtype=dtype)
    mask = None
    if padded:
        mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
        mask[1, ..., :5] = False  # row 1 is left-padded by 5
        mask[3, ..., :11] = False
    module = _Module()
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=dim**-0.5)
    got, weights = decode_attention(module, query, key, value, mask, scaling=dim**-0.5)
    assert weights is None and got.shape == expected.shape == (batch, 1, heads, dim)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), expected.float(), atol=tolerance, rtol=tolerance)


def test_prefill_goes_to_sdpa() -> None:
    torch.manual_seed(1)
    query = torch.randn(1, 4, 6, 16)
    key = value = torch.randn(1, 2, 6, 16)
    module = _Module()
    module.num_key_value_groups = 2
    expected, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.25)
    got, _ = decode_attention(module, query, key, value, None, scaling=0.25)
    assert torch.equal(got, expected)


def test_a_float32_cache_under_a_bfloat16_query() -> None:
    """The running batch's float32 cache: the result comes back in the query's dtype, computed wide."""
    torch.manual_seed(2)
    batch, heads, kv_heads, length, dim = 3, 6, 2, 29, 32
    query = torch.randn(batch, heads, 1, dim, dtype=torch.bfloat16)
    key = torch.randn(batch, kv_heads, length, dim).bfloat16().float()  # bf16 values, stored wide
    value = torch.randn(batch, kv_heads, length, dim).bfloat16().float()
    module = _Module()
    module.num_key_value_groups = heads // kv_heads
    expected, _ = sdpa_attention_forward(module, query.float(), key, value, None, scaling=dim**-0.5)
    got, _ = decode_attention(module, query, key, value, None, scaling=dim**-0.5)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), expected, atol=1e-2, rtol=1e-2)
    # More than one query row (a prefill) goes to SDPA in the query's dtype.
    rows = torch.randn(batch, heads, 4, dim, dtype=torch.bfloat16)
    got_rows, _ = decode_attention(module, rows, key, value, None, scaling=dim**-0.5)
    assert got_rows.dtype == torch.bfloat16 and got_rows.shape == (batch, 4, heads, dim)
