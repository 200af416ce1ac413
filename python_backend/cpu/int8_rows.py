"""The passes around a W8A8 int8 product on CPU, in C: quantizing the input rows, rescaling the result.

Owns ``Int8RowsKernel`` (``native/int8_rows.c``, built and loaded as the other native kernels are)
and ``build_int8_rows_kernel``. ``QuantLinear``'s ``int_mm`` product quantizes each input row to
int8 (one scale per row, or the checkpoint's static scale), multiplies with ``torch._int_mm`` and
scales the int32 result back per row and per output channel. In PyTorch those two passes are a
dozen operations; at decode row counts they took longer than the int8 product itself, which made
W8A8 slower than bfloat16 (docs/quantization.md). Here each is one pass, with the bias added in
float32 before the one rounding to the output dtype.

May import torch and ``python_backend.cpu.native`` only.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from python_backend.cpu.native.build import bind_functions, load_kernel

SOURCE = Path(__file__).with_name("native") / "int8_rows.c"
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_QUANTIZE = {
    torch.bfloat16: "triton_chat_quantize_rows_bf16",
    torch.float16: "triton_chat_quantize_rows_f16",
    torch.float32: "triton_chat_quantize_rows_f32",
}
_QUANTIZE_ARGS = (_PTR, _I64, _I64, _I64, ctypes.c_float, _PTR, _PTR)  # x, stride, rows, dim, static, levels, scales
_RESCALE = {
    torch.bfloat16: "triton_chat_rescale_rows_bf16",
    torch.float16: "triton_chat_rescale_rows_f16",
    torch.float32: "triton_chat_rescale_rows_f32",
}
_RESCALE_ARGS = (_PTR, _I64, _I64, _PTR, _I64, _PTR, _PTR, _PTR)  # acc, rows, cols, row scales, step, col, bias, out


class Int8RowsKernel:
    """``quantize(rows, static)`` and ``rescale(product, scales, ...)`` of a W8A8 product, in C."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._quantize = bind_functions(library, _QUANTIZE, _QUANTIZE_ARGS)
        self._rescale = bind_functions(library, _RESCALE, _RESCALE_ARGS)

    @staticmethod
    def handles(rows: torch.Tensor) -> bool:
        """Whether ``rows`` (2-D, the layer's input) can be quantized here."""
        return rows.device.type == "cpu" and rows.dtype in _QUANTIZE and rows.dim() == 2 and rows.stride(-1) == 1

    def quantize(self, rows: torch.Tensor, static_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 levels [M, K], float32 scales: [M, 1] per row, or the static one [1, 1])."""
        count, dim = rows.shape
        levels = torch.empty((count, dim), dtype=torch.int8)
        if static_scale is not None:
            scales = static_scale.reshape(1, 1)
            fixed = float(scales)
        else:
            scales = torch.empty((count, 1), dtype=torch.float32)
            fixed = 0.0
        status = self._quantize[rows.dtype](
            rows.data_ptr(), rows.stride(0), count, dim, fixed, levels.data_ptr(), scales.data_ptr()
        )
        if status != 0:
            raise RuntimeError(f"int8 quantize kernel failed with status {status} for shape {tuple(rows.shape)}")
        return levels, scales

    def rescale(
        self,
        product: torch.Tensor,
        scales: torch.Tensor,
        weight_scales: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """``dtype`` [M, N] of the int32 ``product`` × row ``scales`` × ``weight_scales`` (+ float32 ``bias``)."""
        count, cols = product.shape
        out = torch.empty((count, cols), dtype=dtype)
        if scales.numel() == count:
            step = 1
        elif scales.numel() == 1:
            step = 0  # one static scale for every row
        else:
            raise ValueError(f"{scales.numel()} row scales for a product of {count} rows")
        status = self._rescale[dtype](
            product.data_ptr(), count, cols, scales.data_ptr(), step, weight_scales.data_ptr(),
            bias.data_ptr() if bias is not None else None, out.data_ptr(),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"int8 rescale kernel failed with status {status} for shape {tuple(product.shape)}")
        return out


def build_int8_rows_kernel(cache_dir: Path | None = None) -> Int8RowsKernel | None:
    """Compile (or reuse) and load the kernel; None, with the reason logged, when it cannot be built."""
    missing = "the int8 row kernel is not available: W8A8 layers quantize and rescale in PyTorch"
    # NaN and infinite inputs keep their defined levels (int8_quantize.h) where the rows are
    # quantized by the scalar loop (CPUs without AVX-512), which -ffast-math would let the
    # compiler assume away.
    return load_kernel(Int8RowsKernel, SOURCE, cache_dir, missing, extra_flags=("-fno-finite-math-only",))
