"""A W8A8 int8 product of our own on x86 CPUs with AVX2: quantize the rows, multiply, rescale.

Owns ``Int8Gemm`` (``native/int8_gemm.c`` where the CPU has AVX512-VNNI, else
``native/int8_gemm_avx2.c``: the same entry points, packed weight and bits; built and loaded as
the other native kernels are),
``PackedInt8`` (a layer's weight packed for it), ``BoundInt8Product`` (the two paired: one
layer's product) and ``build_int8_gemm``. ``torch._int_mm`` reaches
about half of VNNI's int8 rate at the row counts of decode steps (no faster than bfloat16's
products on the same CPU), so W8A8 gained memory but not time; on an AVX2-only CPU it takes a
reference loop, 10-25 times slower than float32's products. This kernel keeps a block of rows
by two tiles of 16 output channels in registers, takes the input as unsigned bytes (the levels
plus 128, the shift compensated per channel) and fuses the rescale and bias into its epilogue; a merged gate/up weight can end its product in
silu(gate) * up (``silu_product``), the bits of the product followed by ``silu.py``'s ``silu_mul``.
One or two rows (a decode step) stream the weight instead: each thread reads an even share of the
tiles in memory order, from the kernel's ``WeightArena`` (2 MiB pages where Linux gives them). Its
int32 sums are exact: a row's result does not depend on the rows beside it.

May import torch, ``python_backend.cpu.native`` and ``python_backend.cpu.weight_arena`` only.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from python_backend.cpu.native.build import bind_functions, entry_address, load_kernel
from python_backend.cpu.weight_arena import WeightArena

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "int8_gemm.c"
AVX2_SOURCE = SOURCE.with_name("int8_gemm_avx2.c")
TILE = 16  # output channels per packed tile (int8_gemm.c)
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_GEMM = {torch.bfloat16: "triton_chat_int8_gemm_bf16", torch.float32: "triton_chat_int8_gemm_f32"}
_GEMM_SILU = "triton_chat_int8_gemm_silu_bf16"  # bfloat16 rows only, as silu_mul takes
# x, x stride, m, k, static scale, packed, compensation, n, col scales, bias, out, out stride
_GEMM_ARGS = (_PTR, _I64, _I64, _I64, ctypes.c_float, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64)


@dataclass(frozen=True)
class PackedInt8:
    """An int8 weight [N, K] in the kernel's layout, with its per-channel shift compensation."""

    packed: torch.Tensor  # int8 [ceil(N / 16) * 16 * K]
    compensation: torch.Tensor  # int32 [ceil(N / 16) * 16]
    out_features: int
    in_features: int
    # Their addresses, read once: a decode step calls the product ~120 times, each call counts.
    addresses: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "addresses", (self.packed.data_ptr(), self.compensation.data_ptr()))

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.compensation.numel() * 4


class Int8Gemm:
    """``pack(values)`` once per layer, then ``product(x, packed, ...)`` per call."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._arena = WeightArena()  # the packed weights, streamed once per decode step
        available = library.triton_chat_int8_gemm_available
        available.restype, available.argtypes = ctypes.c_int, []
        self.available = bool(available())
        fuses_silu = library.triton_chat_int8_gemm_fuses_silu
        fuses_silu.restype, fuses_silu.argtypes = ctypes.c_int, []
        # Whether the gate/up product can end in SiLU (AVX-512's arithmetic: not the AVX2 build).
        self.fuses_silu = bool(fuses_silu())
        pack = library.triton_chat_int8_pack
        pack.restype, pack.argtypes = ctypes.c_int, [_PTR, _I64, _I64, _PTR, _PTR]
        self._pack = pack
        self._gemm = bind_functions(library, _GEMM, _GEMM_ARGS)
        self._gemm_silu = bind_functions(library, {torch.bfloat16: _GEMM_SILU}, _GEMM_ARGS)[torch.bfloat16]

    def entry(self, dtype: torch.dtype) -> int:
        """The address of ``dtype``'s product (``decode_stack.py`` calls it directly)."""
        return entry_address(self._gemm[dtype])

    @property
    def silu_entry(self) -> int | None:
        """The address of the gate/up product that ends in SiLU (``decode_stack.py`` calls it); None
        where this build has none."""
        return entry_address(self._gemm_silu) if self.fuses_silu else None

    def ends_in_silu(self, weight: PackedInt8, dtype: torch.dtype) -> bool:
        """Whether this merged gate/up weight's product can end in SiLU here: a build that fuses it,
        two halves of whole tiles, bfloat16 rows."""
        return self.fuses_silu and dtype == torch.bfloat16 and weight.out_features % (2 * TILE) == 0

    @staticmethod
    def takes(in_features: int) -> bool:
        """Whether a weight of this width can be packed (the kernel reads k four at a time)."""
        return in_features % 4 == 0

    def pack(self, values: torch.Tensor) -> PackedInt8:
        """``values`` int8 [N, K] (CPU) in the kernel's layout."""
        n, k = values.shape
        if values.dtype != torch.int8 or not self.takes(k):
            raise ValueError(f"int8 weights with a width divisible by 4 are packed, got {values.dtype} [{n}, {k}]")
        padded = -(-n // TILE) * TILE
        packed = self._arena.empty(padded * k, torch.int8)
        compensation = torch.empty(padded, dtype=torch.int32)
        source = values.contiguous()
        if self._pack(source.data_ptr(), n, k, packed.data_ptr(), compensation.data_ptr()) != 0:
            raise RuntimeError(f"packing an int8 weight of shape [{n}, {k}] failed")
        return PackedInt8(packed, compensation, n, k)

    def bind(self, values: torch.Tensor) -> BoundInt8Product:
        """The product with ``values`` int8 [N, K] (CPU), packed once."""
        return BoundInt8Product(self, self.pack(values))

    @staticmethod
    def handles_dtype(dtype: torch.dtype) -> bool:
        """Whether layers of this dtype can run here (bfloat16 and float32)."""
        return dtype in _GEMM

    @staticmethod
    def handles(rows: torch.Tensor) -> bool:
        """Whether ``rows`` (2-D, the layer's input) can go through ``product``."""
        return rows.device.type == "cpu" and rows.dtype in _GEMM and rows.dim() == 2 and rows.stride(-1) == 1

    def product(
        self,
        rows: torch.Tensor,
        weight: PackedInt8,
        weight_scales: torch.Tensor,
        bias: torch.Tensor | None,
        static_scale: float | None,
    ) -> torch.Tensor:
        """``rows`` [M, K] times the weight: [M, N] of ``rows``' dtype. ``weight_scales`` float32 [N],
        ``bias`` float32 [N] or None, ``static_scale`` the checkpoint's input scale or None (per row)."""
        return self._run(self._gemm[rows.dtype], rows, weight, weight_scales, bias, static_scale, weight.out_features)

    def silu_product(
        self,
        rows: torch.Tensor,
        weight: PackedInt8,
        weight_scales: torch.Tensor,
        bias: torch.Tensor | None,
        static_scale: float | None,
    ) -> torch.Tensor:
        """silu(gate) * up [M, N / 2] of a merged gate/up weight [N, K] (``ends_in_silu``), bfloat16
        ``rows`` [M, K]: the same bits as ``silu_mul`` of ``product``, the product never written out."""
        if not self.ends_in_silu(weight, rows.dtype):
            raise ValueError(
                f"a gate/up product ending in SiLU takes the AVX-512 build, bfloat16 rows and halves of whole "
                f"{TILE}-channel tiles, got {rows.dtype} rows and {weight.out_features} channels"
                + ("" if self.fuses_silu else " on the AVX2 build")
            )
        return self._run(self._gemm_silu, rows, weight, weight_scales, bias, static_scale, weight.out_features // 2)

    def _run(
        self,
        entry: Callable[..., int],
        rows: torch.Tensor,
        weight: PackedInt8,
        weight_scales: torch.Tensor,
        bias: torch.Tensor | None,
        static_scale: float | None,
        width: int,
    ) -> torch.Tensor:
        count, dim = rows.shape
        # One call quantizes the rows (into the library's own scratch) and multiplies them.
        static = static_scale if static_scale is not None else 0.0
        out = torch.empty(count, width, dtype=rows.dtype)  # sizes as arguments: faster than a tuple
        packed, compensation = weight.addresses
        status = entry(
            rows.data_ptr(), rows.stride(0), count, dim, static, packed, compensation, weight.out_features,
            weight_scales.data_ptr(), bias.data_ptr() if bias is not None else None, out.data_ptr(), width,
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"int8 product kernel failed with status {status} for shape {tuple(rows.shape)}")
        return out


@dataclass(frozen=True)
class BoundInt8Product:
    """One layer's int8 product: the kernel and its weight, packed for it."""

    kernel: Int8Gemm
    weight: PackedInt8

    def __call__(
        self, rows: torch.Tensor, weight_scales: torch.Tensor, bias: torch.Tensor | None, static_scale: float | None
    ) -> torch.Tensor:
        """``rows`` [M, K] times the weight (``Int8Gemm.product``)."""
        return self.kernel.product(rows, self.weight, weight_scales, bias, static_scale)

    def silu_product(
        self, rows: torch.Tensor, weight_scales: torch.Tensor, bias: torch.Tensor | None, static_scale: float | None
    ) -> torch.Tensor:
        """silu(gate) * up of a merged gate/up weight (``Int8Gemm.silu_product``)."""
        return self.kernel.silu_product(rows, self.weight, weight_scales, bias, static_scale)


def build_int8_gemm(cache_dir: Path | None = None) -> Int8Gemm | None:
    """The kernel where it builds: VNNI's where this CPU has AVX512-VNNI, else AVX2's where it has
    AVX2; None otherwise (the reason logged)."""
    missing = "the int8 product kernel is not available: W8A8 layers use torch._int_mm"
    # Without reassociation or fused multiply-adds the epilogue rounds alike in every block and
    # path (the compiler would fuse some inlined copies and not others), so a row's result does not
    # depend on how many rows share its call, nor on which of the two builds runs.
    flags = ("-fno-fast-math", "-ffp-contract=off")
    for source in (SOURCE, AVX2_SOURCE):
        kernel = load_kernel(Int8Gemm, source, cache_dir, missing, extra_flags=flags)
        if kernel is None:
            return None
        if kernel.available:
            return kernel
    logger.info("this CPU has no AVX2: W8A8 layers use torch._int_mm")
    return None
