"""Quantized linear layers (python_backend/cpu/quant_linear.py): each kernel against the float
product of the weight its levels stand for, merged products against separate ones, and the bytes
the weights take."""

from __future__ import annotations

import pytest
import torch

from python_backend.cpu.int8_gemm import Int8Gemm
from python_backend.cpu.int8_rows import Int8RowsKernel
from python_backend.cpu.quant_linear import (
    Int8Paths,
    QuantLinear,
    QuantWeight,
    choose_kernel,
    concat_weights,
    quantize_per_channel,
)

CPU = torch.device("cpu")
N, K = 96, 128


def _weight(bits: int, group: int, symmetric: bool, activations: str, seed: int = 0) -> QuantWeight:
    generator = torch.Generator().manual_seed(seed)
    low, high = (-8, 8) if bits == 4 else (-128, 128)
    values = torch.randint(low, high, (N, K), generator=generator, dtype=torch.int8)
    scale = torch.rand(N, K // group, generator=generator) * 0.01 + 0.001
    zero = None if symmetric else torch.randint(low, high, (N, K // group), generator=generator, dtype=torch.int8)
    static = torch.tensor(0.05) if activations == "static" else None
    return QuantWeight(values, scale, zero, bits, group, activations, static)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize(
    ("bits", "group", "symmetric", "kernel"),
    [(8, K, True, "int8pack"), (4, 32, True, "int4pack"), (4, 64, False, "int4pack"), (8, 32, False, "dequant")],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_only_products_equal_the_dequantized_weight(
    bits: int, group: int, symmetric: bool, kernel: str, dtype: torch.dtype
) -> None:
    weight = _weight(bits, group, symmetric, "none")
    bias = torch.randn(N)
    layer = QuantLinear(weight, bias, dtype, CPU)
    assert layer.kernel == kernel
    x = torch.randn(5, 3, K).to(dtype)
    expected = torch.nn.functional.linear(x.float(), weight.dequantized(torch.float32), bias)
    got = layer(x)
    assert got.shape == (5, 3, N) and got.dtype == dtype
    # float32: the kernels' own float sums; bfloat16: the input, scales and output are rounded to 8 bits.
    assert _relative(got, expected) < (1e-4 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_int8_activation_product_is_the_integer_product(activations: str) -> None:
    weight = _weight(8, K, True, activations)
    layer = QuantLinear(weight, None, torch.float32, CPU)
    assert layer.kernel == "int_mm"
    x = torch.randn(7, K)
    scale = torch.tensor(0.05) if activations == "static" else x.abs().amax(1, keepdim=True) / 127
    levels = torch.round(x / scale).clamp(-128, 127)
    expected = (levels @ weight.values.float().t()) * scale * weight.scale.t()
    assert _relative(layer(x), expected) < 1e-6
    # Against the unquantized input, only the activations' rounding is lost: about 1 % for int8.
    assert _relative(layer(x), x @ weight.dequantized(torch.float32).t()) < (0.02 if activations == "dynamic" else 0.1)


def test_load_time_int8_is_close_to_the_float_layer() -> None:
    torch.manual_seed(0)
    float_weight = torch.randn(N, K) * 0.05
    weight = quantize_per_channel(float_weight)
    assert weight.values.dtype == torch.int8 and int(weight.values.abs().max()) == 127
    layer = QuantLinear(weight, None, torch.float32, CPU)
    x = torch.randn(16, K)
    # Per-channel weights and per-row activations in int8: each rounding adds ~0.5 %.
    assert _relative(layer(x), x @ float_weight.t()) < 0.02


def test_merged_product_equals_the_separate_ones() -> None:
    parts = [_weight(4, 32, False, "none", seed) for seed in range(3)]
    merged = concat_weights(parts)
    assert merged is not None
    x = torch.randn(4, K, dtype=torch.bfloat16)
    whole = QuantLinear(merged, None, torch.bfloat16, CPU)(x)
    separate = torch.cat([QuantLinear(p, None, torch.bfloat16, CPU)(x) for p in parts], dim=-1)
    assert torch.equal(whole, separate)
    assert concat_weights([_weight(4, 32, False, "none"), _weight(8, K, True, "none")]) is None


def test_weights_are_held_in_their_bits() -> None:
    bf16_bytes = N * K * 2
    int8 = QuantLinear(_weight(8, K, True, "dynamic"), None, torch.bfloat16, CPU)
    int4 = QuantLinear(_weight(4, 32, True, "none"), None, torch.bfloat16, CPU)
    assert int8.weight_t.dtype == torch.int8
    assert int8.weight_bytes() <= bf16_bytes / 2 + N * 4
    assert int4.weight_bytes() <= bf16_bytes / 4 + N * (K // 32) * 2 * 2


def test_wrong_input_dtype_is_refused() -> None:
    layer = QuantLinear(_weight(8, K, True, "dynamic"), None, torch.bfloat16, CPU)
    with pytest.raises(TypeError, match="bfloat16"):
        layer(torch.randn(2, K))


def test_cuda_kernels_are_chosen_without_a_gpu() -> None:
    # Selection is pure: a CPU-only machine imports and decides what a CUDA device would run.
    cuda = torch.device("cuda")
    assert choose_kernel(_weight(8, K, True, "dynamic"), cuda) == "int_mm"
    assert choose_kernel(_weight(8, K, True, "none"), cuda) == "dequant"
    assert choose_kernel(_weight(4, 32, False, "none"), cuda) == "dequant"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "form", ["bf16", "f32", "w8a8", "w8a8-torch", "w8a8-onednn", "w8a16", "w4a16-g32", "w4a16-g64"]
)
def test_the_products_benchmark_times_correct_products(form: str, dtype: torch.dtype) -> None:
    # benchmarks/quant_products.py times these, on any x86 CPU (bfloat16 where oneDNN cannot prepack
    # it, too): each must compute the float product, within its bits, in its rows' dtype.
    from benchmarks.quant_products import FORMS, _product, row_dtype

    assert form in FORMS
    torch.manual_seed(0)
    weight = torch.randn(N, K) * 0.05
    x = torch.randn(16, K).to(row_dtype(form, dtype))
    got = _product(form, weight, dtype)(x)
    assert got.dtype == x.dtype
    # bfloat16 rounds to ~0.4 %; int8 adds ~1 %; 4-bit levels ~8 % (measured 5-7 % here).
    tolerance = 0.02 if form in ("bf16", "f32", "w8a16") else 0.04 if form.startswith("w8a8") else 0.12
    assert _relative(got, x.float() @ weight.t()) < tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_row_quantization_gives_pytorchs_levels_and_scales(int8_rows: Int8RowsKernel, dtype: torch.dtype) -> None:
    x = (torch.randn(33, K) * torch.logspace(-3, 2, 33).unsqueeze(1)).to(dtype)
    x[5] = 0  # an all-zero row: the smallest scale, every level 0
    levels, scales = int8_rows.quantize(x, None)
    expected_scale = (x.float().abs().amax(1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    expected = torch.round(x.float() / expected_scale).clamp(-128, 127)
    assert torch.allclose(scales, expected_scale, rtol=1e-6, atol=0)
    # x * (1 / s) against x / s: a level may round the other way where x / s lies on a half.
    differs = levels.float() != expected
    assert int(differs.sum()) <= x.numel() // 1000 and float((levels.float() - expected).abs().max()) <= 1
    assert not levels[5].any()
    static, one = int8_rows.quantize(x, torch.tensor(0.01))
    # The largest rows overflow one fixed scale: their levels are clamped to int8's range.
    assert one.numel() == 1 and int(static[-1].min()) == -128 and int(static[-1].max()) == 127


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_c_row_quantization_skips_nans_and_clamps_infinities(int8_rows: Int8RowsKernel, dtype: torch.dtype) -> None:
    # 20 values: one full vector of 16 and a tail of 4.
    x = torch.tensor([[126.0, -254.0, float("nan"), 64.0] * 5, [float("inf"), float("-inf"), float("nan"), 3.0] * 5])
    levels, scales = int8_rows.quantize(x[:1].to(dtype), None)
    # A NaN neither sets the row's scale nor escapes the int8 range: it takes the lowest level.
    assert float(scales) == 2.0
    assert levels.tolist() == [[63, -127, -128, 32] * 5]
    levels, _ = int8_rows.quantize(x[1:].to(dtype), torch.tensor(0.5))
    assert levels.tolist() == [[127, -128, -128, 6] * 5]


@pytest.mark.parametrize("activations", ["dynamic", "static"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_passes_give_the_pytorch_product(int8_rows: Int8RowsKernel, activations: str, dtype: torch.dtype) -> None:
    weight = _weight(8, K, True, activations)
    bias = torch.randn(N)
    plain = QuantLinear(weight, bias, dtype, CPU)
    fast = QuantLinear(weight, bias, dtype, CPU, Int8Paths(rows=int8_rows))
    assert fast.kernel == "int_mm"
    x = torch.randn(2, 9, K).to(dtype)
    got, expected = fast(x), plain(x)
    assert got.shape == expected.shape == (2, 9, N) and got.dtype == dtype
    # The bias is added before the one rounding to bfloat16 here, after it in PyTorch's passes.
    assert _relative(got, expected) < (1e-5 if dtype == torch.float32 else 1e-2)
    # A row's result does not depend on the rows beside it.
    assert torch.equal(fast(x[:1, :1]), got[:1, :1])
    assert fast.weight_bytes() == plain.weight_bytes()


@pytest.mark.parametrize("activations", ["dynamic", "static"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_our_int8_product_gives_the_integer_product(int8_gemm: Int8Gemm, activations: str, dtype: torch.dtype) -> None:
    weight = _weight(8, K, True, activations)
    bias = torch.randn(N)
    plain = QuantLinear(weight, bias, dtype, CPU)
    layer = QuantLinear(weight, bias, dtype, CPU, Int8Paths(gemm=int8_gemm))
    assert layer.kernel == "int8_gemm" and plain.kernel == "int_mm"
    x = torch.randn(3, 5, K).to(dtype)
    got = layer(x)
    assert got.shape == (3, 5, N) and got.dtype == dtype
    assert _relative(got, plain(x)) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(layer(x[:1, :1]), got[:1, :1])  # a row's result is its own
    # Held only packed: int8 levels (channels padded to 16) and a compensation and a scale per channel.
    assert layer.weight_bytes() <= N * K + N * 8 + 16 * K + (4 if activations == "static" else 0)
    assert not hasattr(layer, "weight_t")
    # A float16 layer or a width not divisible by 4 keeps torch._int_mm (with the C row passes: below).
    assert QuantLinear(weight, None, torch.float16, CPU, Int8Paths(gemm=int8_gemm)).kernel == "int_mm"


def test_c_row_passes_round_float16_as_pytorch_does(int8_rows: Int8RowsKernel) -> None:
    # Every float16 widens exactly: with a static scale of 1, the levels are the rounded values.
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    finite = every[every.isfinite()].reshape(-1, 1)
    levels, _ = int8_rows.quantize(finite, torch.tensor(1.0))
    assert torch.equal(levels.float(), torch.round(finite.float()).clamp(-128, 127))
    # Narrowing: a product of ones times float32 scales is the scales, rounded to float16 to nearest even.
    generator = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 2**31 - 1, (1 << 16,), generator=generator, dtype=torch.int64).to(torch.int32)
    specials = torch.tensor([65504.0, 65519.99, 65520.0, 1e6, 2**-24, 2**-25, 2**-25 * 1.0001, 2**-14, 6.1e-5, 0.0])
    scales = torch.cat([bits.view(torch.float32), specials, -specials, torch.tensor([float("nan"), float("inf")])])
    ones = torch.ones((scales.numel(), 1), dtype=torch.int32)
    got = int8_rows.rescale(ones, scales.reshape(-1, 1), torch.ones(1), None, torch.float16)
    expected = scales.reshape(-1, 1).to(torch.float16)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got[~got.isnan()].view(torch.int16), expected[~expected.isnan()].view(torch.int16))


@pytest.mark.usefixtures("int8_gemm")  # a CPU with our int8 kernel, as the layers below sit beside it
@pytest.mark.parametrize(("dtype", "width"), [(torch.float16, K), (torch.bfloat16, 30), (torch.float32, 30)])
def test_layers_beside_our_int8_kernel_get_the_c_row_passes(
    monkeypatch: pytest.MonkeyPatch, int8_paths: Int8Paths, int8_rows: Int8RowsKernel, dtype: torch.dtype, width: int
) -> None:
    calls: list[int] = []
    quantize = int8_rows.quantize

    def counted(x: torch.Tensor, static: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(x.shape[0])
        return quantize(x, static)

    monkeypatch.setattr(int8_rows, "quantize", counted)
    generator = torch.Generator().manual_seed(width)
    values = torch.randint(-128, 128, (N, width), generator=generator, dtype=torch.int8)
    weight = QuantWeight(values, torch.rand(N, 1, generator=generator) * 0.01 + 0.001, None, 8, width, "dynamic")
    bias = torch.randn(N, generator=generator)
    layer = QuantLinear(weight, bias, dtype, CPU, int8_paths)  # both paths, as a model load builds them
    assert layer.kernel == "int_mm"
    x = torch.randn(3, width, generator=generator).to(dtype)
    got = layer(x)
    assert calls == [3] and got.dtype == dtype
    expected = QuantLinear(weight, bias, dtype, CPU)(x)  # PyTorch's own passes around torch._int_mm
    assert _relative(got, expected) < (1e-5 if dtype == torch.float32 else 1e-2)
