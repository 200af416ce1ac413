"""Linear layers whose weights stay quantized in memory: int8 (W8A8, W8A16) and 4-bit (W4A16).

Owns ``QuantWeight`` (a layer's integer levels, scales and zero points, in one layout whatever the
checkpoint's), ``QuantLinear`` (the product, with the kernel chosen once per layer),
``quantize_per_channel`` (the ``--quantization int8`` path: symmetric int8 levels from a float
weight) and ``concat_weights`` (layers of one input as one weight); ``quant_install.py`` puts the
layers in place.

Kernels (``QuantLinear.kernel`` names the one a layer runs):

- ``int8_gemm`` (W8A8 on x86 CPUs with AVX2): our own int8 product (``int8_gemm.py``; VPDPBUSD
  where the CPU has AVX512-VNNI, VPMADDWD on AVX2, the same bits), the rows quantized and the
  result rescaled in the same C library; the weight is held only in its packed layout.
- ``int_mm`` (W8A8 elsewhere, and float16 layers or widths not divisible by 4 beside our product):
  activations quantized per row (dynamic) or with the checkpoint's static scale, then
  ``torch._int_mm`` (oneDNN's int8 GEMM with VNNI/AMX on x86; cuBLASLt on CUDA), int32 results
  scaled back per row and per output channel. On CPU the two passes around the product run in C
  (``int8_rows.py``) when it builds, and the weight is handed over as the transposed view
  of its ``[N, K]`` rows: oneDNN reads that layout 2.5× faster for one row than a ``[K, N]`` copy.
- ``int8pack`` (W8A16, symmetric per-channel): ``aten._weight_int8pack_mm``, CPU only.
- ``int4pack`` (W4A16, group-wise, symmetric, asymmetric or with float offsets): the weight repacked once by
  ``aten._convert_weight_to_int4pack_for_cpu`` and multiplied by ``aten._weight_int4pack_mm_for_cpu``.
- ``npu_quant`` / ``npu_weight_quant`` (Ascend, float16/bfloat16 layers): torch-npu's
  ``npu_quant_matmul`` (W8A8) and ``npu_weight_quant_batchmatmul`` (8-bit weight-only, per channel
  or per group of a multiple of 32, with or without zero points), ``npu_products.py``.
- ``dequant`` (anything else: group-wise 8-bit, asymmetric 8-bit, 4-bit off the CPU, float32 on
  an NPU): the levels stay in memory as int8 and are widened for each call; correct, not fast.

The merged products keep the model's own forward (``ProjectionSlice``), and the lean decode step
(``fast_decode.py``) calls the same products.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from python_backend.cpu.int8_gemm import BoundInt8Product, Int8Gemm, build_int8_gemm
from python_backend.cpu.int8_rows import Int8RowsKernel, build_int8_rows_kernel
from python_backend.cpu.npu_products import (
    HALF_DTYPES,
    NpuQuantProduct,
    NpuWeightQuantProduct,
    weight_quant_takes,
)

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what the CPU int4 kernel takes
# torch._int_mm on CUDA wants more than 16 rows and dimensions in multiples of 8.
_CUDA_MIN_ROWS = 17


@dataclass(frozen=True)
class Int8Paths:
    """The C paths of W8A8 products on CPU: our int8 product where the CPU has AVX2 (``gemm``), and
    ``torch._int_mm`` with the row passes in C (``rows``) for the layers it does not take (no AVX2,
    float16, a width not divisible by 4); both None: PyTorch's passes."""

    rows: Int8RowsKernel | None = None
    gemm: Int8Gemm | None = None

    @classmethod
    def build(cls) -> Int8Paths:
        """What this machine builds (each kernel logs why it is missing)."""
        return cls(build_int8_rows_kernel(), build_int8_gemm())


@dataclass(frozen=True)
class QuantWeight:
    """One layer's quantized weight: ``W[n, k] = (values[n, k] - zero[n, g]) * scale[n, g] + offset[n, g]``,
    ``g = k // group`` (no zero: 0; no offset: 0). The float offset is GGUF Q4_1's minimum (``gguf_blocks.py``)."""

    values: torch.Tensor  # int8 [N, K]: the integer levels (4-bit ones in -8..7)
    scale: torch.Tensor  # float32 [N, K // group_size]
    zero: torch.Tensor | None  # int8 [N, K // group_size]; None: symmetric
    bits: int  # 8 or 4
    group_size: int  # K: one scale per output channel
    activations: str  # "dynamic" (per row), "static" (input_scale) or "none" (weight-only)
    input_scale: torch.Tensor | None = None  # float32 scalar, static activations only
    offset: torch.Tensor | None = None  # float32 [N, K // group_size]; weight-only layers only

    def __post_init__(self) -> None:
        if self.offset is not None and self.activations != "none":
            raise ValueError("a float offset per group needs weight-only (activations 'none') levels")

    @property
    def out_features(self) -> int:
        return int(self.values.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.values.shape[1])

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The float weight the levels stand for (tests, and the ``dequant`` kernel)."""
        levels = self.values.float().unflatten(1, (-1, self.group_size))
        if self.zero is not None:
            levels = levels - self.zero.float().unsqueeze(-1)
        weight = levels * self.scale.unsqueeze(-1)
        if self.offset is not None:
            weight = weight + self.offset.float().unsqueeze(-1)
        return weight.flatten(1).to(dtype)


def quantize_per_channel(weight: torch.Tensor) -> QuantWeight:
    """Symmetric int8 levels, one scale per output channel, dynamic per-row activations (W8A8)."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
    values = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return QuantWeight(values, scale, None, 8, w.shape[1], "dynamic")


def concat_weights(weights: list[QuantWeight]) -> QuantWeight | None:
    """Several layers of one input as one (stacked output channels); None where their schemes differ."""
    first = weights[0]
    same = all(
        (w.bits, w.group_size, w.activations, w.in_features, w.zero is None)
        == (first.bits, first.group_size, first.activations, first.in_features, first.zero is None)
        for w in weights
    )
    if not same:
        return None
    if first.activations == "static":
        scales = [w.input_scale for w in weights]
        reference = scales[0]
        if reference is None or any(s is None or not torch.equal(s, reference) for s in scales):
            return None  # one product quantizes its input once: the static scales must agree
    zeros = [w.zero for w in weights if w.zero is not None]
    # A layer without offsets (GGUF Q4_0 beside Q4_1) joins with offsets of 0.
    with_offset = any(w.offset is not None for w in weights)
    offsets = [w.offset if w.offset is not None else torch.zeros_like(w.scale) for w in weights]
    return QuantWeight(
        values=torch.cat([w.values for w in weights]),
        scale=torch.cat([w.scale for w in weights]),
        zero=torch.cat(zeros) if zeros else None,
        bits=first.bits,
        group_size=first.group_size,
        activations=first.activations,
        input_scale=first.input_scale,
        offset=torch.cat(offsets) if with_offset else None,
    )


def choose_kernel(
    weight: QuantWeight, device: torch.device, native_int8: bool = False, dtype: torch.dtype = torch.bfloat16
) -> str:
    """The product that serves ``weight`` on ``device`` for ``dtype`` layers (the module docstring
    lists them); ``native_int8``: whether our int8 product (``int8_gemm.py``) is available for this dtype."""
    per_channel = weight.group_size == weight.in_features
    if device.type == "npu":
        if dtype not in HALF_DTYPES or weight.bits != 8:
            return "dequant"
        if weight.activations != "none":
            return "npu_quant"
        takes = weight_quant_takes(weight.in_features, weight.group_size, weight.offset is not None)
        return "npu_weight_quant" if takes else "dequant"
    if weight.activations != "none":
        return "int8_gemm" if native_int8 and device.type == "cpu" and Int8Gemm.takes(weight.in_features) else "int_mm"
    if device.type == "cpu" and weight.bits == 8 and per_channel and weight.zero is None and weight.offset is None:
        return "int8pack"
    if (
        device.type == "cpu"
        and weight.bits == 4
        and weight.group_size in INT4_GROUP_SIZES
        and weight.in_features % weight.group_size == 0
    ):
        return "int4pack"
    return "dequant"


class QuantLinear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` held as quantized levels and scales (see ``QuantWeight``)."""

    # Buffers, typed for the products; each kernel registers its own (``__init__``).
    bias: torch.Tensor | None
    bias_f32: torch.Tensor | None
    weight_t: torch.Tensor
    weight_packed: torch.Tensor
    weight_compensation: torch.Tensor
    weight_scale: torch.Tensor
    input_scale: torch.Tensor | None
    weight_int8: torch.Tensor
    weight_int4: torch.Tensor
    scale_and_zero: torch.Tensor
    weight_levels: torch.Tensor
    weight_zero: torch.Tensor | None
    weight_offset: torch.Tensor | None

    def __init__(
        self,
        weight: QuantWeight,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        device: torch.device,
        int8: Int8Paths | None = None,
        npu_ops: Any = None,
    ) -> None:
        """``int8``: the C paths W8A8 layers take on CPU where they serve them; None: PyTorch's.
        ``npu_ops``: torch-npu's operators for the Ascend kernels (None: ``torch_npu`` itself)."""
        gemm = int8.gemm if int8 is not None else None
        super().__init__()
        self.in_features = weight.in_features
        self.out_features = weight.out_features
        self.dtype = dtype
        self.bits = weight.bits
        self.group_size = weight.group_size
        self.activations = weight.activations
        self.asymmetric = weight.zero is not None
        self.kernel = choose_kernel(weight, device, gemm is not None and Int8Gemm.handles_dtype(dtype), dtype)
        self._npu: NpuQuantProduct | NpuWeightQuantProduct | None = None
        self.register_buffer("bias", None if bias is None else bias.detach().to(device, dtype), persistent=False)
        rows_kernel = int8.rows if int8 is not None else None
        self._rows_kernel = rows_kernel if self.kernel == "int_mm" and device.type == "cpu" else None
        self._int8_gemm: BoundInt8Product | None = None
        if self.kernel == "int8_gemm" and gemm is not None:
            self._int8_gemm = gemm.bind(weight.values.cpu())
        in_c = self._rows_kernel is not None or self._int8_gemm is not None  # the bias is added in float32 there
        f32_bias = bias.detach().float().contiguous().to(device) if bias is not None and in_c else None
        self.register_buffer("bias_f32", f32_bias, persistent=False)
        if self.kernel in ("int_mm", "int8_gemm"):
            static = weight.input_scale
            self.register_buffer(
                "input_scale", None if static is None else static.float().reshape(1, 1).to(device), persistent=False
            )
        self._static = float(weight.input_scale) if weight.input_scale is not None else None
        if self.kernel in ("npu_quant", "npu_weight_quant"):
            ops = npu_ops if npu_ops is not None else importlib.import_module("torch_npu")
            if self.kernel == "npu_quant":
                self._npu = NpuQuantProduct(ops, weight.values, weight.scale, bias, weight.input_scale, dtype, device)
            else:
                self._npu = NpuWeightQuantProduct(
                    ops, weight.values, weight.scale, weight.zero, weight.group_size, bias, dtype, device
                )
            for name, tensor in self._npu.tensors().items():
                self.register_buffer(f"npu_{name}", tensor, persistent=False)
        elif self._int8_gemm is not None:
            self.register_buffer("weight_packed", self._int8_gemm.weight.packed, persistent=False)
            self.register_buffer("weight_compensation", self._int8_gemm.weight.compensation, persistent=False)
            self.register_buffer("weight_scale", weight.scale.reshape(-1).float().contiguous(), persistent=False)
        elif self.kernel == "int_mm":
            # cuBLASLt wants [K, N] in memory; oneDNN is faster with the transposed view of [N, K].
            values = weight.values.contiguous().to(device)
            self.register_buffer("weight_t", values.t() if device.type == "cpu" else values.t().contiguous(), False)
            self.register_buffer("weight_scale", weight.scale.reshape(1, -1).float().to(device), persistent=False)
        elif self.kernel == "int8pack":
            self.register_buffer("weight_int8", weight.values.contiguous().to(device), persistent=False)
            self.register_buffer("weight_scale", weight.scale.reshape(-1).to(device, dtype), persistent=False)
        elif self.kernel == "int4pack":
            # The kernel's levels are unsigned (0..15, 8 in the middle): value = (u - 8) * scale + offset.
            unsigned = (weight.values.to(torch.int32) + 8).contiguous()
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned, 1)
            zero = weight.zero.float() if weight.zero is not None else torch.zeros_like(weight.scale)
            offsets = -zero * weight.scale
            if weight.offset is not None:
                offsets = offsets + weight.offset.float()
            scale_and_zero = torch.stack([weight.scale, offsets], dim=-1).transpose(0, 1).contiguous()
            self.register_buffer("weight_int4", packed.to(device), persistent=False)
            self.register_buffer("scale_and_zero", scale_and_zero.to(device, dtype), persistent=False)
        else:
            self.register_buffer("weight_levels", weight.values.to(device), persistent=False)
            self.register_buffer("weight_scale", weight.scale.to(device), persistent=False)
            levels_zero = weight.zero.to(device) if weight.zero is not None else None
            self.register_buffer("weight_zero", levels_zero, persistent=False)
            offset = weight.offset.float().to(device) if weight.offset is not None else None
            self.register_buffer("weight_offset", offset, persistent=False)

    @property
    def int8_gemm(self) -> BoundInt8Product | None:
        """Our int8 product this layer runs (``int8_gemm.py``), or None (another kernel)."""
        return self._int8_gemm

    @property
    def ends_in_silu(self) -> bool:
        """Whether this (merged gate/up) layer's product can end in silu(gate) * up: our int8 kernel's
        AVX-512 build, on bfloat16 rows, with halves of whole tiles (``Int8Gemm.silu_product``)."""
        gemm = self._int8_gemm
        return gemm is not None and gemm.kernel.ends_in_silu(gemm.weight, self.dtype)

    def silu_product_unchecked(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this merged gate/up layer's product, never written out: the bits of
        ``silu_mul(apply_unchecked(x))``. Only where ``ends_in_silu``."""
        if self._int8_gemm is None:
            raise ValueError(f"only the int8_gemm kernel's products end in SiLU, this layer runs {self.kernel}")
        return self._on_int8_gemm(self._int8_gemm.silu_product, x, self.out_features // 2)

    def _on_int8_gemm(self, product: Callable[..., torch.Tensor], x: torch.Tensor, width: int) -> torch.Tensor:
        """``product`` (one of our int8 kernel's, bound to this weight) on ``x``'s rows, made
        contiguous where they are not, as ``[..., width]``."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        rows = flat if flat.stride(-1) == 1 else flat.contiguous()
        out = product(rows, self.weight_scale, self.bias_f32, self._static)
        return out.reshape(*shape[:-1], width)

    @property
    def static_input_scale(self) -> float | None:
        """The checkpoint's input scale for every row, or None (one per row, dynamic)."""
        return self._static

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype:
            raise TypeError(f"QuantLinear expects {self.dtype} input, got {x.dtype}")
        return self.apply_unchecked(x)

    def apply_unchecked(self, x: torch.Tensor) -> torch.Tensor:
        if self._int8_gemm is not None:
            return self._on_int8_gemm(self._int8_gemm, x, self.out_features)
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if self._npu is not None:  # the bias is added inside the operator
            return self._npu(flat).reshape(*shape[:-1], self.out_features)
        if self._rows_kernel is not None and self._rows_kernel.handles(flat):
            levels, scales = self._rows_kernel.quantize(flat, self.input_scale)
            product = torch._int_mm(levels, self.weight_t)
            out = self._rows_kernel.rescale(product, scales, self.weight_scale, self.bias_f32, self.dtype)
            return out.reshape(*shape[:-1], self.out_features)
        if self.kernel == "int_mm":
            out = self._int8_product(flat)
        elif self.kernel == "int8pack":
            out = torch.ops.aten._weight_int8pack_mm(flat.contiguous(), self.weight_int8, self.weight_scale)
        elif self.kernel == "int4pack":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat.contiguous(), self.weight_int4, self.group_size, self.scale_and_zero
            )
        else:
            out = torch.nn.functional.linear(flat, self._dequantized())
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def _int8_product(self, flat: torch.Tensor) -> torch.Tensor:
        rows = flat.float()
        if self.input_scale is not None:
            scale = self.input_scale
        else:
            scale = (rows.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
        levels = torch.round(rows / scale).clamp(-128, 127).to(torch.int8)
        count = levels.shape[0]
        if levels.is_cuda and count < _CUDA_MIN_ROWS:
            levels = torch.nn.functional.pad(levels, (0, 0, 0, _CUDA_MIN_ROWS - count))
        product = torch._int_mm(levels, self.weight_t)[:count]
        return (product.float() * scale * self.weight_scale).to(self.dtype)

    def _dequantized(self) -> torch.Tensor:
        levels = self.weight_levels.float().unflatten(1, (-1, self.group_size))
        if self.weight_zero is not None:
            levels = levels - self.weight_zero.float().unsqueeze(-1)
        weight = levels * self.weight_scale.unsqueeze(-1)
        if self.weight_offset is not None:
            weight = weight + self.weight_offset.unsqueeze(-1)
        return weight.flatten(1).to(self.dtype)

    def weight_bytes(self) -> int:
        """What the layer's weight takes in memory, as held by its kernel."""
        return sum(b.numel() * b.element_size() for name, b in self.named_buffers() if name not in ("bias", "bias_f32"))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"group_size={self.group_size}, activations={self.activations}, kernel={self.kernel}"
        )
