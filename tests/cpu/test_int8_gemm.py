"""Our int8 product (python_backend/cpu/int8_gemm.py), its AVX512-VNNI build and its AVX2 one: the exact
integer product, rescaled, for every row count and width the blocks and tiles split, the same bits on
either build, and its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_backend.cpu.int8_gemm import AVX2_SOURCE, SOURCE, Int8Gemm
from python_backend.cpu.native.build import build_library
from python_backend.cpu.silu import build_silu_kernel


def _reference(
    x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, static: torch.Tensor | None
) -> torch.Tensor:
    """PyTorch's own passes: levels per row (or the static scale), the integer product, the rescale."""
    rows = x.float()
    if static is None:
        scale = (rows.abs().amax(1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    else:
        scale = static.reshape(1, 1)
    levels = torch.round(rows / scale).clamp(-128, 127)
    product = (levels.double() @ values.double().t()).float()  # exact: every sum is below 2**53
    out = product * scale * scales.reshape(1, -1)
    return out + bias if bias is not None else out


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 64, 129])
@pytest.mark.parametrize(("n", "k"), [(16, 4), (40, 64), (96, 128), (33, 36)])
def test_product_is_the_rescaled_integer_product(int8_gemm: Int8Gemm, rows: int, n: int, k: int) -> None:
    generator = torch.Generator().manual_seed(rows * 1000 + n + k)
    values = torch.randint(-128, 128, (n, k), generator=generator, dtype=torch.int8)
    scales = torch.rand(n, generator=generator) * 0.01 + 0.001
    bias = torch.randn(n, generator=generator)
    x = torch.randn(rows, k, generator=generator) * 3
    got = int8_gemm.product(x, int8_gemm.pack(values), scales, bias, None)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    # The sums are exact; x * (1 / s) may put a level one off where x / s lies on a half.
    assert torch.allclose(got, _reference(x, values, scales, bias, None), rtol=1e-3, atol=1e-3)
    # Rows are independent: one row alone gives what it gave among the others.
    assert torch.equal(int8_gemm.product(x[-1:], int8_gemm.pack(values), scales, bias, None), got[-1:])


def test_bfloat16_rows_static_scale_and_no_bias(int8_gemm: Int8Gemm) -> None:
    generator = torch.Generator().manual_seed(3)
    values = torch.randint(-127, 128, (48, 64), generator=generator, dtype=torch.int8)
    scales = torch.rand(48, generator=generator) * 0.01
    x = torch.randn(9, 64, generator=generator).to(torch.bfloat16)
    static = torch.tensor(0.02)
    got = int8_gemm.product(x, int8_gemm.pack(values), scales, None, float(static))
    assert got.dtype == torch.bfloat16
    expected = _reference(x, values, scales, None, static)
    assert float((got.float() - expected).norm() / expected.norm()) < 1e-2  # bfloat16's rounding


def test_widths_not_divisible_by_four_are_refused(int8_gemm: Int8Gemm) -> None:
    assert not Int8Gemm.takes(30) and Int8Gemm.takes(32)
    with pytest.raises(ValueError, match="divisible by 4"):
        int8_gemm.pack(torch.zeros(8, 30, dtype=torch.int8))


def _build(source: Path) -> Int8Gemm:
    library = build_library(source, extra_flags=("-fno-fast-math", "-ffp-contract=off"))
    if library is None:
        pytest.skip("no C compiler")
    return Int8Gemm(library)


def _as_the_kernel_rounds(
    x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor, static: float | None
) -> torch.Tensor:
    """The product with the kernels' own arithmetic: levels of x * (1 / s), exact sums, then
    (sum * s) * scale + bias in float32, rounded once to ``x``'s dtype."""
    rows = x.float()
    if static is None:
        scale = (rows.abs().amax(1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    else:
        scale = torch.full((rows.shape[0], 1), static)
    levels = torch.round(torch.clamp(rows * (1 / scale), -128, 127))
    sums = (levels.double() @ values.double().t()).float()
    return ((sums * scale) * scales.reshape(1, -1) + bias).to(x.dtype)


def test_each_build_says_whether_this_cpu_runs_it() -> None:
    flags = Path("/proc/cpuinfo").read_text()
    vnni, avx2 = _build(SOURCE), _build(AVX2_SOURCE)
    assert vnni.available == ("avx512_vnni" in flags and "avx512bw" in flags)
    assert vnni.fuses_silu == vnni.available
    assert avx2.available == ("avx2" in flags and "f16c" in flags)
    assert not avx2.fuses_silu and avx2.silu_entry is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_builds_give_the_same_bits(dtype: torch.dtype) -> None:
    # A row's result must not depend on which CPU serves it: the sums are exact and the epilogues
    # round alike. Where only the AVX2 build runs, it is held to the exact product instead.
    builds = [kernel for kernel in (_build(SOURCE), _build(AVX2_SOURCE)) if kernel.available]
    if not builds:
        pytest.skip("neither build runs on this CPU")
    generator = torch.Generator().manual_seed(5)
    for n, k, rows in ((16, 4, 1), (33, 36, 2), (1000, 576, 1), (1000, 576, 7), (96, 1540, 130), (40, 8196, 2)):
        values = torch.randint(-128, 128, (n, k), generator=generator, dtype=torch.int8)
        scales = torch.rand(n, generator=generator) * 0.01 + 0.001
        bias = torch.randn(n, generator=generator)
        x = (torch.randn(rows, k, generator=generator) * 3).to(dtype)
        for static in (None, 0.02):
            results = [kernel.product(x, kernel.pack(values), scales, bias, static) for kernel in builds]
            assert all(torch.equal(got.view(torch.int8), results[0].view(torch.int8)) for got in results[1:])
            assert torch.equal(results[0], _as_the_kernel_rounds(x, values, scales, bias, static)), (n, k, rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k"), [(33, 36), (1000, 576), (40, 8196)])
def test_one_or_two_rows_equal_their_rows_of_a_larger_product(
    int8_gemm: Int8Gemm, dtype: torch.dtype, n: int, k: int
) -> None:
    # One or two rows (a decode step) take their own path, split over the team (1000 channels: 63
    # tiles, unevenly); rows wider than its stack buffer (8196) take the blocks. The int32 sums are
    # exact and the epilogue rounds alike, so each row is bit for bit the row of a 9-row product.
    generator = torch.Generator().manual_seed(n + k)
    values = torch.randint(-128, 128, (n, k), generator=generator, dtype=torch.int8)
    scales = torch.rand(n, generator=generator) * 0.01 + 0.001
    bias = torch.randn(n, generator=generator)
    x = (torch.randn(9, k, generator=generator) * 3).to(dtype)
    packed = int8_gemm.pack(values)
    for static in (None, 0.02):
        for with_bias in (bias, None):
            whole = int8_gemm.product(x, packed, scales, with_bias, static)
            assert torch.equal(int8_gemm.product(x[:1], packed, scales, with_bias, static), whole[:1])
            assert torch.equal(int8_gemm.product(x[3:5], packed, scales, with_bias, static), whole[3:5])
    wider = torch.zeros(9, k + 8, dtype=dtype)
    wider[:, :k] = x  # rows further apart than their width, as a slice of a wider tensor gives
    assert torch.equal(
        int8_gemm.product(wider[:1, :k], packed, scales, bias, None),
        int8_gemm.product(x[:1], packed, scales, bias, None),
    )
    expected = _reference(x.float(), values, scales, bias, None)
    got = int8_gemm.product(x[:1], packed, scales, bias, None)
    assert torch.allclose(got.float(), expected[:1], rtol=1e-2 if dtype == torch.bfloat16 else 1e-3, atol=1e-2)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("static", [None, 0.03])
def test_a_gate_up_product_ending_in_silu_gives_the_bits_of_the_product_then_silu_mul(
    int8_gemm: Int8Gemm, bias: bool, static: float | None
) -> None:
    silu = build_silu_kernel(torch.bfloat16)
    if silu is None or not int8_gemm.fuses_silu:
        pytest.skip("no SiLU kernel on this CPU, or the AVX2 build (no fused SiLU)")
    generator = torch.Generator().manual_seed(11)
    # Halves of 1, 3 (an odd share over two threads) and 96 tiles; one or two rows stream the weight.
    for half, k in ((16, 32), (48, 128), (1536, 576)):
        values = torch.randint(-128, 128, (2 * half, k), generator=generator, dtype=torch.int8)
        scales = torch.rand(2 * half, generator=generator) * 0.02 + 0.001
        offsets = torch.randn(2 * half, generator=generator) if bias else None
        packed = int8_gemm.pack(values)
        assert int8_gemm.ends_in_silu(packed, torch.bfloat16)
        for rows in (1, 2, 3, 6, 7, 64, 130):
            # Large inputs too: SiLU's exp overflows for the most negative gates.
            x = (torch.randn(rows, k, generator=generator) * 4).to(torch.bfloat16)
            expected = silu.silu_mul(int8_gemm.product(x, packed, scales, offsets, static))
            got = int8_gemm.silu_product(x, packed, scales, offsets, static)
            assert got.shape == (rows, half)
            assert torch.equal(got.view(torch.int16), expected.view(torch.int16)), (half, rows)


def test_a_gate_up_product_of_partial_tiles_or_float32_rows_is_refused_for_silu(int8_gemm: Int8Gemm) -> None:
    partial = int8_gemm.pack(torch.ones(48, 32, dtype=torch.int8))  # halves of 24 channels
    assert not int8_gemm.ends_in_silu(partial, torch.bfloat16)
    with pytest.raises(ValueError, match="48 channels"):
        int8_gemm.silu_product(torch.ones(2, 32, dtype=torch.bfloat16), partial, torch.ones(48), None, None)
    whole = int8_gemm.pack(torch.ones(64, 32, dtype=torch.int8))
    assert not int8_gemm.ends_in_silu(whole, torch.float32)
    assert int8_gemm.ends_in_silu(whole, torch.bfloat16) == int8_gemm.fuses_silu
    if not int8_gemm.fuses_silu:
        with pytest.raises(ValueError, match="on the AVX2 build"):
            int8_gemm.silu_product(torch.ones(2, 32, dtype=torch.bfloat16), whole, torch.ones(64), None, None)
    with pytest.raises(ValueError, match="float32 rows"):
        int8_gemm.silu_product(torch.ones(2, 32), whole, torch.ones(64), None, None)
