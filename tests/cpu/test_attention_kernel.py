"""The C decode-attention kernels (bfloat16 and float32 caches, float32 queries over either) equal
float32 attention, and building them fails over to PyTorch."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from python_backend.cpu.attention import decode_attention
from python_backend.cpu.fast_decode import causal_rows, prompt_attention
from python_backend.cpu.native import attention_kernel, build
from python_backend.cpu.native.attention_kernel import DecodeAttentionKernel, build_kernel
from tests.fixtures.native import built_or_skip


class _Module(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


@pytest.fixture(scope="module")
def kernel() -> DecodeAttentionKernel:
    return built_or_skip(build_kernel())


def _cache_view(batch: int, kv_heads: int, length: int, dim: int) -> torch.Tensor:
    """A view of a longer buffer, as the running batch's cache hands it to attention."""
    return torch.randn(batch, kv_heads, length + 13, dim).bfloat16()[:, :, :length]


# (batch, heads, kv_heads, length, dim): the last two span several score blocks (16 positions in
# the bfloat16 kernel, 8 in the float32 one), with a partial last block and padding across block
# boundaries.
_SHAPES = [
    (1, 9, 3, 1, 64),
    (4, 9, 3, 37, 64),
    (3, 14, 2, 70, 64),
    (2, 8, 8, 19, 128),
    (5, 6, 2, 23, 80),
    (2, 9, 3, 150, 64),
    (3, 16, 4, 33, 128),
]


@pytest.mark.parametrize(("batch", "heads", "kv_heads", "length", "dim"), _SHAPES)
@pytest.mark.parametrize("padded", [False, True])
def test_kernel_matches_float32_attention(
    kernel: DecodeAttentionKernel, batch: int, heads: int, kv_heads: int, length: int, dim: int, padded: bool
) -> None:
    torch.manual_seed(batch * 100 + length)
    query = torch.randn(batch, heads, 1, dim).bfloat16()
    key, value = _cache_view(batch, kv_heads, length, dim), _cache_view(batch, kv_heads, length, dim)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    if padded and length > 1:
        mask[-1, ..., : length // 2] = False  # the last row is left-padded
    module = _Module(heads // kv_heads)
    expected, _ = sdpa_attention_forward(
        module, query.float(), key.float(), value.float(), mask if padded else None, scaling=dim**-0.5
    )
    got, _ = decode_attention(module, query, key, value, mask if padded else None, scaling=dim**-0.5, kernel=kernel)
    assert got.dtype == torch.bfloat16 and got.shape == (batch, 1, heads, dim)
    assert torch.allclose(got.float(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dim", [64, 96, 128, 256])
def test_a_maximum_that_rises_late_and_holes_in_the_mask_match_float32_attention(
    kernel: DecodeAttentionKernel, dim: int
) -> None:
    """The softmax is kept online, block by block: a far larger score in a late block rescales what
    was summed before it, and masked positions inside a row (a whole block of them, and garbage
    in their cache rows) weigh nothing."""
    torch.manual_seed(dim)
    length = 90
    query = torch.randn(2, 6, 1, dim).bfloat16()
    key, value = _cache_view(2, 2, length, dim), _cache_view(2, 2, length, dim)
    key[:, :, 70] = query[:, ::3, 0] * 4  # a score far above the rest, in the fifth block
    keep = torch.ones(2, length, dtype=torch.bool)
    keep[0, 20:40] = False  # a whole 16-position block and more, inside the row
    keep[1, 5:9] = False
    keep[1, 80:] = False
    key[0, :, 20:40] = float("nan")
    value[0, :, 20:40] = float("nan")
    module = _Module(3)
    expected, _ = sdpa_attention_forward(
        module, query.float(), key.float().nan_to_num(), value.float().nan_to_num(), keep[:, None, None, :],
        scaling=dim**-0.5,
    )  # fmt: skip
    got = kernel.attend(query, key, value, keep, dim**-0.5)
    assert torch.isfinite(got.float()).all()
    assert torch.allclose(got.float(), expected, atol=1e-2, rtol=1e-2)


def test_a_row_with_every_position_masked_gets_zeros(kernel: DecodeAttentionKernel) -> None:
    torch.manual_seed(7)
    query = torch.randn(2, 9, 1, 64).bfloat16()
    key, value = _cache_view(2, 3, 40, 64), _cache_view(2, 3, 40, 64)
    keep = torch.ones(2, 40, dtype=torch.bool)
    keep[1] = False
    got = kernel.attend(query, key, value, keep, 0.125)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    assert torch.isfinite(got.float()).all()


def test_a_score_does_not_depend_on_where_padding_puts_it(kernel: DecodeAttentionKernel) -> None:
    """The same sequence behind different amounts of left padding attends bit-identically.

    Each score has its own reduction tree and the weighted sum skips masked positions, so where the
    16-position blocks fall does not change a row's result (a batch's padding must not change it).
    """
    torch.manual_seed(3)
    query = torch.randn(1, 9, 1, 64).bfloat16()
    key, value = _cache_view(1, 3, 45, 64), _cache_view(1, 3, 45, 64)
    alone = kernel.attend(query, key, value, None, 0.125)
    for pad in (1, 7, 16, 21):
        padded_key = torch.cat([torch.zeros(1, 3, pad, 64, dtype=torch.bfloat16), key], dim=2)
        padded_value = torch.cat([torch.zeros(1, 3, pad, 64, dtype=torch.bfloat16), value], dim=2)
        keep = torch.ones(1, pad + 45, dtype=torch.bool)
        keep[0, :pad] = False
        assert torch.equal(kernel.attend(query, padded_key, padded_value, keep, 0.125), alone)


_FLOAT32_SHAPES = [*_SHAPES, (2, 4, 2, 24, 36)]  # and a head size not a multiple of 8: the plain loops


@pytest.mark.parametrize(("batch", "heads", "kv_heads", "length", "dim"), _FLOAT32_SHAPES)
@pytest.mark.parametrize("padded", [False, True])
def test_float32_kernel_matches_sdpa(
    kernel: DecodeAttentionKernel, batch: int, heads: int, kv_heads: int, length: int, dim: int, padded: bool
) -> None:
    """A float32 model's cache goes to the kernel's float32 variant, equal to SDPA within rounding."""
    torch.manual_seed(batch * 10 + length)
    query = torch.randn(batch, heads, 1, dim)
    key = torch.randn(batch, kv_heads, length + 5, dim)[:, :, :length]
    value = torch.randn(batch, kv_heads, length + 5, dim)[:, :, :length]
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    if padded and length > 1:
        mask[0, ..., : length // 3 + 1] = False
    module = _Module(heads // kv_heads)
    assert kernel.handles(query, key, value)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask if padded else None, scaling=dim**-0.5)
    got, _ = decode_attention(module, query, key, value, mask if padded else None, scaling=dim**-0.5, kernel=kernel)
    assert got.dtype == torch.float32 and got.shape == (batch, 1, heads, dim)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("batch", "heads", "kv_heads", "length", "dim"), _FLOAT32_SHAPES)
@pytest.mark.parametrize("padded", [False, True])
def test_a_float32_query_over_a_bfloat16_cache_equals_the_widened_cache(
    kernel: DecodeAttentionKernel, batch: int, heads: int, kv_heads: int, length: int, dim: int, padded: bool
) -> None:
    """kv_cache_dtype bfloat16 under a float32 model: the same sums as over the widened rows, bit
    for bit (only the storage differs), and within bfloat16 rounding of the float32 cache."""
    torch.manual_seed(batch * 7 + length)
    query = torch.randn(batch, heads, 1, dim)
    key = torch.randn(batch, kv_heads, length + 5, dim)[:, :, :length]
    value = torch.randn(batch, kv_heads, length + 5, dim)[:, :, :length]
    keep = torch.ones(batch, length, dtype=torch.bool)
    if padded and length > 1:
        keep[-1, : length // 3 + 1] = False
    narrow_key, narrow_value = key.bfloat16(), value.bfloat16()
    assert kernel.handles(query, narrow_key, narrow_value)
    got = kernel.attend(query, narrow_key, narrow_value, keep, dim**-0.5)
    assert got.dtype == torch.float32 and got.shape == (batch, 1, heads, dim)
    assert torch.equal(got, kernel.attend(query, narrow_key.float(), narrow_value.float(), keep, dim**-0.5))
    full = kernel.attend(query, key, value, keep, dim**-0.5)
    assert torch.allclose(got, full, atol=2e-2, rtol=2e-2)
    assert not torch.equal(got, full)  # the rounding is real: the cache did hold bfloat16


def test_mixed_dtypes_the_kernel_has_no_variant_for_never_reach_it(kernel: DecodeAttentionKernel) -> None:
    query, key = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 5, 16)
    assert not kernel.handles(query.bfloat16(), key, key)  # a bfloat16 model over a float32 cache
    assert not kernel.handles(query.half(), key.half(), key.half())
    assert not kernel.handles(query, key.bfloat16(), key)
    assert kernel.handles(query.bfloat16(), key.bfloat16(), key.bfloat16())
    assert kernel.handles(query, key.bfloat16(), key.bfloat16())  # a float32 model, kv_cache_dtype bfloat16


def test_the_library_is_built_once_and_reused(tmp_path: Path) -> None:
    first = build_kernel(tmp_path)
    if first is None:
        pytest.skip("no C compiler")
    libraries = list(tmp_path.glob("decode_attention-*.so"))
    assert len(libraries) == 1
    stamp = libraries[0].stat().st_mtime_ns
    assert build_kernel(tmp_path) is not None
    assert libraries[0].stat().st_mtime_ns == stamp


def test_a_changed_header_rebuilds_the_library(tmp_path: Path) -> None:
    source_dir, cache = tmp_path / "src", tmp_path / "cache"
    source_dir.mkdir()
    (source_dir / "value.h").write_text("#define VALUE 1\n")
    source = source_dir / "probe.c"
    source.write_text('#include "value.h"\nint triton_chat_probe(void) { return VALUE; }\n')
    first = build.build_library(source, cache)
    if first is None:
        pytest.skip("no C compiler")
    assert first.triton_chat_probe() == 1
    (source_dir / "value.h").write_text("#define VALUE 2\n")
    second = build.build_library(source, cache)
    assert second is not None and second.triton_chat_probe() == 2
    assert len(list(cache.glob("probe-*.so"))) == 2


def test_without_a_compiler_the_kernel_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING):
        assert build_kernel(tmp_path) is None
    assert "no C compiler" in caplog.text


def test_a_failing_build_is_logged_and_gives_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    with caplog.at_level(logging.WARNING):
        assert build_kernel(tmp_path) is None
    assert "building decode_attention failed" in caplog.text
    assert not list(tmp_path.glob("*.so"))


def test_a_missing_source_gives_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(attention_kernel, "SOURCE", tmp_path / "absent.c")
    with caplog.at_level(logging.WARNING):
        assert build_kernel(tmp_path) is None
    assert "source is missing" in caplog.text


@pytest.mark.parametrize(("count", "past", "dim"), [(1, 0, 64), (37, 0, 64), (20, 45, 64), (18, 7, 128), (9, 4, 80)])
@pytest.mark.parametrize(
    "dtypes", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32), (torch.float32, torch.bfloat16)]
)
def test_prompt_rows_through_the_kernel_equal_causal_sdpa(
    kernel: DecodeAttentionKernel, count: int, past: int, dim: int, dtypes: tuple[torch.dtype, torch.dtype]
) -> None:
    """A prompt segment's causal attention by the kernel (its rows sharing the segment's keys and
    values, each mask ending at its own position) equals SDPA's, and each row equals a decode step
    over exactly its visible prefix, bit for bit: the masked tail is skipped, not scored."""
    query_dtype, cache_dtype = dtypes
    torch.manual_seed(count * 31 + past)
    query = torch.randn(1, 9, count, dim).to(query_dtype)
    key = torch.randn(1, 3, past + count, dim).to(cache_dtype)
    value = torch.randn(1, 3, past + count, dim).to(cache_dtype)
    visible = causal_rows(count, past + count)
    got = prompt_attention(query, key, value, dim**-0.5, kernel, visible)
    assert got.dtype == query_dtype and got.shape == (count, 9 * dim)
    expected = prompt_attention(query.float(), key.float(), value.float(), dim**-0.5)  # SDPA
    tolerance = 1e-2 if torch.bfloat16 in dtypes else 1e-5
    assert torch.allclose(got.float(), expected, atol=tolerance, rtol=tolerance)
    for t in (0, count // 2, count - 1):
        end = past + t + 1
        alone = kernel.attend(query[:, :, t : t + 1], key[:, :, :end], value[:, :, :end], None, dim**-0.5)
        assert torch.equal(got[t], alone.reshape(-1))
