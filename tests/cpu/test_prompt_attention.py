"""The tiled prompt-attention kernel equals causal SDPA, and the lean step uses it for prompts."""

from __future__ import annotations

import pytest
import torch

from python_backend.cpu.fast_decode import prompt_attention
from python_backend.cpu.prompt_attention import PromptAttentionKernel, build_prompt_kernel
from tests.fixtures.native import built_or_skip


@pytest.fixture(scope="module")
def tiles() -> PromptAttentionKernel:
    return built_or_skip(build_prompt_kernel(), "no C compiler or no AVX512-BF16: the kernel is not built here")


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "count", "past"),
    [
        (9, 3, 64, 1, 0),  # one row
        (9, 3, 64, 37, 0),  # a partial last block of rows and of positions
        (9, 3, 64, 20, 45),  # after a cached prefix
        (14, 2, 64, 23, 9),  # 7 heads per KV head: one row per work item
        (16, 1, 64, 11, 3),  # 16 heads per KV head: two passes over the heads
        (8, 8, 128, 19, 30),  # no grouping, head size 128
        (4, 2, 96, 5, 2),  # head size 96
        (8, 2, 32, 29, 5),  # head size 32: twelve vectors per pass over the values
        (2, 1, 256, 7, 3),  # head size 256: one vector per pass
    ],
)
def test_the_kernel_equals_causal_sdpa(
    tiles: PromptAttentionKernel, heads: int, kv_heads: int, dim: int, count: int, past: int
) -> None:
    torch.manual_seed(heads * 100 + count + past)
    query = torch.randn(1, heads, count, dim).bfloat16()
    key = torch.randn(1, kv_heads, past + count + 4, dim).bfloat16()[:, :, : past + count]  # a cache view
    value = torch.randn(1, kv_heads, past + count + 4, dim).bfloat16()[:, :, : past + count]
    assert tiles.handles(query, key, value)
    got = tiles.attend(query, key, value, dim**-0.5)
    assert got.dtype == torch.bfloat16 and got.shape == (count, heads * dim)
    exact = prompt_attention(query.float(), key.float(), value.float(), dim**-0.5)  # float32 SDPA
    sdpa = prompt_attention(query, key, value, dim**-0.5)  # bfloat16 SDPA: the error to match
    error, reference_error = (got.float() - exact).abs().max(), (sdpa.float() - exact).abs().max()
    assert error <= 2 * reference_error + 1e-3, (error, reference_error)
    # A later row's keys do not leak into an earlier row: changing the last position's key and
    # value leaves every row but the last as it was.
    key[:, :, -1], value[:, :, -1] = 100.0, 100.0
    changed = tiles.attend(query, key, value, dim**-0.5)
    assert torch.equal(changed[:-1], got[:-1]) and not torch.equal(changed[-1], got[-1])


def test_shapes_the_kernel_does_not_take_go_elsewhere(tiles: PromptAttentionKernel) -> None:
    query, key = torch.randn(1, 4, 3, 64).bfloat16(), torch.randn(1, 2, 5, 64).bfloat16()
    assert tiles.handles(query, key, key)
    assert not tiles.handles(query.float(), key.float(), key.float())  # float32: the decode kernel's rows
    assert not tiles.handles(query[..., :48], key[..., :48], key[..., :48])  # head size not a multiple of 32
    assert not tiles.handles(query, key[:, :, :2], key[:, :, :2])  # fewer positions than queries
    # Through prompt_attention: the kernel's result where it applies, SDPA's shape elsewhere.
    assert torch.equal(prompt_attention(query, key, key, 0.125, tiles=tiles), tiles.attend(query, key, key, 0.125))
    assert prompt_attention(query.float(), key.float(), key.float(), 0.125, tiles=tiles).shape == (3, 256)
