"""Quantized products on Ascend (python_backend/cpu/npu_products.py) without an NPU.

torch-npu's two operators are stood in for by ``DocumentedTorchNpu``: each computes what torch-npu's
documentation says the operator computes and refuses, as the operator does, the layouts and dtypes
that documentation does not list. The products must then give the float product of the weight
their levels stand for, and the kernel choice must send Ascend layers to them.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
import torch

from python_backend.cpu.npu_products import NpuQuantProduct, NpuWeightQuantProduct
from python_backend.cpu.quant_linear import QuantWeight, choose_kernel

CPU = torch.device("cpu")
N, K = 96, 128


class DocumentedTorchNpu:
    """``npu_quant_matmul`` and ``npu_weight_quant_batchmatmul`` as documented, on CPU tensors."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def npu_quant_matmul(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        scale: torch.Tensor,
        *,
        offset: torch.Tensor | None = None,
        pertoken_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        output_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        self.calls.append("npu_quant_matmul")
        (m, k), (k2, n) = x1.shape, x2.shape
        if x1.dtype != torch.int8 or x2.dtype != torch.int8 or k != k2:
            raise RuntimeError(f"x1 [m, k] and x2 [k, n] int8, got {x1.dtype} {x1.shape} and {x2.dtype} {x2.shape}")
        if scale.shape != (n,) or scale.dtype not in (torch.float32, torch.bfloat16) or offset is not None:
            raise RuntimeError(f"scale [n] float32 or bfloat16 without an offset, got {scale.dtype} {scale.shape}")
        if pertoken_scale is None or pertoken_scale.shape != (m,) or pertoken_scale.dtype != torch.float32:
            raise RuntimeError("pertoken_scale [m] float32")
        if output_dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError(f"output_dtype float16 or bfloat16 with per-token scales, got {output_dtype}")
        if bias is not None and (bias.shape != (n,) or bias.dtype not in (torch.int32, torch.float32, output_dtype)):
            raise RuntimeError(f"bias [n] int32, float32 or the output's dtype, got {bias.dtype} {bias.shape}")
        out = (x1.double() @ x2.double()) * scale.double() * pertoken_scale.double()[:, None]
        return (out + bias.double() if bias is not None else out).to(output_dtype)

    def npu_weight_quant_batchmatmul(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        antiquant_scale: torch.Tensor,
        antiquant_offset: torch.Tensor | None = None,
        quant_scale: torch.Tensor | None = None,
        quant_offset: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        antiquant_group_size: int = 0,
    ) -> torch.Tensor:
        self.calls.append("npu_weight_quant_batchmatmul")
        (_, k), (k2, n) = x.shape, weight.shape
        if x.dtype not in (torch.float16, torch.bfloat16) or weight.dtype != torch.int8 or k != k2:
            raise RuntimeError(f"x [m, k] float16/bfloat16 and weight [k, n] int8, got {x.dtype}, {weight.dtype}")
        group = antiquant_group_size
        if group and (group % 32 or group >= k):
            raise RuntimeError(f"antiquant_group_size 0 or a multiple of 32 below k, got {group}")
        shape = (n,) if group == 0 else (-(-k // group), n)
        for name, tensor in (("antiquant_scale", antiquant_scale), ("antiquant_offset", antiquant_offset)):
            if tensor is not None and (tensor.shape != shape or tensor.dtype != x.dtype):
                raise RuntimeError(f"{name} {list(shape)} of x's dtype, got {tensor.dtype} {list(tensor.shape)}")
        allowed = (torch.float32,) if x.dtype == torch.bfloat16 else (torch.float16, torch.float32)
        if bias is not None and (bias.shape != (n,) or bias.dtype not in allowed):
            raise RuntimeError(f"bias [n] float32 (float16 too for float16 inputs), got {bias.dtype} {bias.shape}")
        if quant_scale is not None or quant_offset is not None:
            raise RuntimeError("an int8 output is not what a model layer wants")
        scale, offset = antiquant_scale.double(), antiquant_offset
        if group:
            scale = scale.repeat_interleave(group, dim=0)[:k]
            offset = offset.repeat_interleave(group, dim=0)[:k] if offset is not None else None
        widened = (weight.double() + (offset.double() if offset is not None else 0)) * scale
        out = x.double() @ widened
        return (out + bias.double() if bias is not None else out).to(x.dtype)


def _weight(group: int, symmetric: bool, activations: str) -> QuantWeight:
    generator = torch.Generator().manual_seed(group + (2 if symmetric else 3))
    values = torch.randint(-128, 128, (N, K), generator=generator, dtype=torch.int8)
    scale = torch.rand(N, K // group, generator=generator) * 0.01 + 0.001
    zero = None if symmetric else torch.randint(-128, 128, (N, K // group), generator=generator, dtype=torch.int8)
    static = torch.tensor(0.05) if activations == "static" else None
    return QuantWeight(values, scale, zero, 8, group, activations, static)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_ascend_layers_get_torch_npus_products_where_they_take_the_layout() -> None:
    npu = cast("torch.device", SimpleNamespace(type="npu"))  # the choice reads the device's type only
    assert choose_kernel(_weight(K, True, "dynamic"), npu, dtype=torch.bfloat16) == "npu_quant"
    assert choose_kernel(_weight(K, True, "static"), npu, dtype=torch.float16) == "npu_quant"
    assert choose_kernel(_weight(K, True, "none"), npu, dtype=torch.bfloat16) == "npu_weight_quant"
    assert choose_kernel(_weight(32, False, "none"), npu, dtype=torch.bfloat16) == "npu_weight_quant"
    # What the operators do not take is widened per call: groups of 16, float32 layers.
    assert choose_kernel(_weight(16, True, "none"), npu, dtype=torch.bfloat16) == "dequant"
    assert choose_kernel(_weight(K, True, "dynamic"), npu, dtype=torch.float32) == "dequant"


@pytest.mark.parametrize("activations", ["dynamic", "static"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_w8a8_is_the_float_product_within_int8_activations(activations: str, dtype: torch.dtype) -> None:
    ops = DocumentedTorchNpu()
    weight, bias = _weight(K, True, activations), torch.randn(N)
    product = NpuQuantProduct(ops, weight.values, weight.scale, bias, weight.input_scale, dtype, CPU)
    x = torch.randn(7, K).to(dtype)
    got = product(x)
    assert ops.calls == ["npu_quant_matmul"] and got.shape == (7, N) and got.dtype == dtype
    expected = torch.nn.functional.linear(x.float(), weight.dequantized(torch.float32), bias)
    # int8 activations cost about 1 % (the static scale clips a few inputs); the output's rounding the rest.
    assert _relative(got, expected) < 0.04
    assert set(product.tensors()) == {"weight_int8", "weight_scale"} | (
        {"input_scale"} if activations == "static" else set()
    )


@pytest.mark.parametrize(("group", "symmetric"), [(K, True), (K, False), (32, True), (64, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_w8a16_is_the_product_of_the_widened_weight(group: int, symmetric: bool, dtype: torch.dtype) -> None:
    ops = DocumentedTorchNpu()
    weight, bias = _weight(group, symmetric, "none"), torch.randn(N)
    product = NpuWeightQuantProduct(ops, weight.values, weight.scale, weight.zero, group, bias, dtype, CPU)
    x = torch.randn(5, K).to(dtype)
    got = product(x)
    assert ops.calls == ["npu_weight_quant_batchmatmul"] and got.shape == (5, N) and got.dtype == dtype
    expected = torch.nn.functional.linear(x.float(), weight.dequantized(torch.float32), bias)
    assert _relative(got, expected) < 2e-2  # the scales and the output in 16 bits


def test_a_torch_npu_without_the_operators_is_named() -> None:
    weight = _weight(K, True, "dynamic")
    with pytest.raises(RuntimeError, match="torch_npu has no npu_quant_matmul"):
        NpuQuantProduct(SimpleNamespace(), weight.values, weight.scale, None, None, torch.bfloat16, CPU)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        NpuQuantProduct(DocumentedTorchNpu(), weight.values, weight.scale, None, None, torch.float32, CPU)
