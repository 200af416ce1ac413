"""Our bfloat16 product (python_backend/cpu/bf16_gemm.py): within bfloat16's rounding of the exact
product, the same for a row whatever rows are beside it, one weight layout per layer, and the
layers and the lean decode step that use it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_backend.cpu.bf16_gemm import Bf16Gemm, build_bf16_gemm
from python_backend.cpu.fused_projections import FusedProjections
from python_backend.cpu.linear import PackedLinear
from python_backend.cpu.silu import build_silu_kernel
from tests.fixtures.engine_driver import load_on_cpu


@pytest.fixture(scope="module")
def bf16_gemm() -> Bf16Gemm:
    kernel = build_bf16_gemm()
    if kernel is None:
        pytest.skip("no C compiler, no AVX512-BF16, or an AMX CPU (oneDNN's products are kept there)")
    return kernel


def _within_rounding(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``got`` is the product rounded to bfloat16, up to float32 accumulation error."""
    exact = x.double() @ weight.double().T + (bias.double() if bias is not None else 0)
    scale = x.double().abs() @ weight.double().abs().T
    tolerance = torch.finfo(torch.bfloat16).eps * exact.abs() + x.shape[-1] ** 0.5 * 1.2e-7 * scale + 1e-30
    assert got.dtype == torch.bfloat16 and got.shape == exact.shape
    assert ((got.double() - exact).abs() <= tolerance).all()


# 576 and 952 channels: 36 and 60 tiles (the last one cut short), shares that walk groups of three.
@pytest.mark.parametrize(("n", "k"), [(80, 48), (17, 2), (3072, 576), (33, 130), (576, 256), (952, 258)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_product_is_the_exact_one_rounded(bf16_gemm: Bf16Gemm, n: int, k: int, bias: bool) -> None:
    torch.manual_seed(n + k)
    weight = torch.randn(n, k, dtype=torch.bfloat16)
    offsets = torch.randn(n, dtype=torch.bfloat16) if bias else None
    packed = bf16_gemm.pack(weight, offsets)
    for rows in (1, 2, 5, 6, 7, 64):
        x = torch.randn(rows, k, dtype=torch.bfloat16)
        _within_rounding(packed.product(x), x, weight, offsets)


def test_a_row_is_bit_identical_whatever_rows_are_beside_it(bf16_gemm: Bf16Gemm) -> None:
    # Unlike oneDNN, whose kernel (and summation order) follows the row count: decode and prefill,
    # and any batch, give a sequence the same bits.
    torch.manual_seed(2)
    packed = bf16_gemm.pack(torch.randn(960, 576, dtype=torch.bfloat16), torch.randn(960, dtype=torch.bfloat16))
    x = torch.randn(97, 576, dtype=torch.bfloat16)
    full = packed.product(x)
    for start, stop in ((0, 1), (5, 6), (3, 7), (40, 56), (90, 97)):
        assert torch.equal(packed.product(x[start:stop]), full[start:stop])
    # A strided input (a slice of a wider row) and a 3-D one give the same rows too.
    wide = torch.randn(4, 700, dtype=torch.bfloat16)
    wide[:, :576] = x[:4]
    assert torch.equal(packed.product(wide[:, :576]), full[:4])
    assert torch.equal(packed.product(x[:6].view(2, 3, 576)), full[:6].view(2, 3, 960))


def test_an_odd_width_is_refused_by_name(bf16_gemm: Bf16Gemm) -> None:
    weight = torch.randn(8, 5, dtype=torch.bfloat16)
    assert not bf16_gemm.takes(weight)
    with pytest.raises(ValueError, match="even width"):
        bf16_gemm.pack(weight, None)
    # The layer keeps oneDNN's product instead.
    layer = PackedLinear(torch.nn.Linear(5, 8).to(torch.bfloat16), bf16_gemm)
    assert layer.own is None and layer.packed_weight is not None and not layer.rows_independent


def test_an_input_of_the_wrong_width_is_refused(bf16_gemm: Bf16Gemm) -> None:
    packed = bf16_gemm.pack(torch.randn(16, 32, dtype=torch.bfloat16), None)
    for x in (torch.randn(2, 16, dtype=torch.bfloat16), torch.randn(1, 4, 16, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match="width 16 for a layer of in_features=32"):
            packed.product(x)


def test_layers_hold_one_layout_and_compute_the_product(bf16_gemm: Bf16Gemm) -> None:
    torch.manual_seed(3)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    layer = PackedLinear(linear, bf16_gemm)
    assert layer.own is not None and layer.packed_weight is None and layer.rows_independent
    x = torch.randn(3, 4, 64, dtype=torch.bfloat16)
    _within_rounding(layer(x).view(-1, 48), x.view(-1, 64), linear.weight, linear.bias)
    q, k = torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(64, 16, bias=False)
    group = FusedProjections([q.to(torch.bfloat16), k.to(torch.bfloat16)], bf16_gemm)
    assert group.own is not None and group.packed_weight is None
    merged = group.apply_unchecked(x)
    assert torch.equal(group.split(merged)[0], PackedLinear(q, bf16_gemm)(x))


def test_a_bfloat16_model_loads_onto_the_kernel(bf16_gemm: Bf16Gemm, tiny_model_dir: Path) -> None:
    loaded = load_on_cpu(tiny_model_dir, "bfloat16")
    layer = loaded.model.get_decoder().layers[0]
    assert layer.mlp.down_proj.own is not None
    assert layer.self_attn.q_proj.group.own is not None
    assert loaded.model.get_output_embeddings().own is not None
    # A float32 model keeps oneDNN's products (the kernel is bfloat16's only).
    wide = load_on_cpu(tiny_model_dir, "float32")
    assert wide.model.get_decoder().layers[0].mlp.down_proj.own is None


@pytest.mark.parametrize("bias", [False, True])
def test_a_gate_up_product_ending_in_silu_gives_the_bits_of_the_product_then_silu_mul(
    bf16_gemm: Bf16Gemm, bias: bool
) -> None:
    silu = build_silu_kernel(torch.bfloat16)
    if silu is None:
        pytest.skip("no SiLU kernel on this CPU")
    torch.manual_seed(5)
    for half, k in ((16, 48), (48, 576), (1536, 576)):
        weight = torch.randn(2 * half, k, dtype=torch.bfloat16) * 0.2
        offsets = torch.randn(2 * half, dtype=torch.bfloat16) if bias else None
        packed = bf16_gemm.pack(weight, offsets)
        assert packed.ends_in_silu
        for rows in (1, 2, 5, 6, 7, 64, 130):
            # Large inputs too: SiLU's exp overflows for the most negative gates.
            x = torch.randn(rows, k, dtype=torch.bfloat16) * 4
            expected = silu.silu_mul(packed.product(x))
            got = packed.silu_product(x)
            assert got.shape == (rows, half)
            assert torch.equal(got.view(torch.int16), expected.view(torch.int16)), (half, rows)
    assert torch.equal(packed.silu_product(x[:6].view(2, 3, k)), packed.silu_product(x[:6]).view(2, 3, half))


def test_a_gate_up_weight_of_partial_tiles_is_refused_for_silu(bf16_gemm: Bf16Gemm) -> None:
    packed = bf16_gemm.pack(torch.randn(48, 32, dtype=torch.bfloat16), None)  # halves of 24 channels
    assert not packed.ends_in_silu
    with pytest.raises(ValueError, match="48 channels"):
        packed.silu_product(torch.randn(2, 32, dtype=torch.bfloat16))
