"""A bfloat16 product of our own for linear layers on CPUs with AVX512-BF16 and no AMX.

Owns ``Bf16Gemm`` (``native/bf16_gemm.c``, built and loaded as the other native kernels are),
``PackedBf16`` (a layer's weight packed for it) and ``build_bf16_gemm``. oneDNN's prepacked
product costs about 17 us per call before any work and streams a one-row product's weight at
about half the memory's rate: a one-user decode step of the demo model spent 14 ms in products
whose weights take about 6 ms to read. This kernel keeps a block of rows by four tiles of 16
output channels in registers and sums every row in one fixed order, so a row's result does not
depend on the rows beside it (the batch-invariant mode's property, at no cost). On AMX CPUs
oneDNN's tile products are kept: they are far faster on prompts. Packed weights live in the
kernel's ``WeightArena`` (2 MiB pages where Linux gives them).

May import torch, ``python_backend.cpu.native`` and ``python_backend.cpu.weight_arena`` only.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from python_backend.cpu.native.build import entry_address, load_kernel
from python_backend.cpu.weight_arena import WeightArena

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "bf16_gemm.c"
TILE = 16  # output channels per packed tile (bf16_gemm.c)
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


@dataclass(frozen=True)
class PackedBf16:
    """A bfloat16 weight [N, K] in the kernel's layout, with its bias widened to float32, and the
    kernel that multiplies by it."""

    packed: torch.Tensor  # bfloat16 [ceil(N / 16) * 16 * K]
    bias: torch.Tensor | None  # float32 [N]
    out_features: int
    in_features: int
    gemm: Bf16Gemm
    # Their addresses, read once: a decode step calls the product ~120 times, each call counts.
    addresses: tuple[int, int | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bias = self.bias.data_ptr() if self.bias is not None else None
        object.__setattr__(self, "addresses", (self.packed.data_ptr(), bias))

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., K] bfloat16 times the weight, plus the bias: [..., N] bfloat16."""
        return self.gemm.product(x, self)

    @property
    def ends_in_silu(self) -> bool:
        """Whether ``silu_product`` takes this weight: a merged gate/up of two halves of whole tiles."""
        return self.out_features % (2 * TILE) == 0

    def silu_product(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of this merged gate/up weight's product, in one pass: [..., N / 2]."""
        return self.gemm.silu_product(x, self)


class Bf16Gemm:
    """``pack(weight, bias)`` once per layer, then ``product(x, packed)`` per call."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._arena = WeightArena()  # the packed weights, streamed once per decode step
        available = library.triton_chat_bf16_gemm_available
        available.restype, available.argtypes = ctypes.c_int, []
        self.available = bool(available())
        self._pack = library.triton_chat_bf16_pack
        self._pack.restype, self._pack.argtypes = ctypes.c_int, [_PTR, _I64, _I64, _PTR]
        self._gemm = library.triton_chat_bf16_gemm
        self._gemm.restype = ctypes.c_int
        self._gemm.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _I64]
        self._gemm_silu = library.triton_chat_bf16_gemm_silu
        self._gemm_silu.restype, self._gemm_silu.argtypes = ctypes.c_int, self._gemm.argtypes

    @property
    def gemm_address(self) -> int:
        """The product's entry point (``decode_stack.py`` calls it directly)."""
        return entry_address(self._gemm)

    @property
    def gemm_silu_address(self) -> int:
        """The gate/up product that ends in silu(gate) * up (``decode_stack.py`` calls it directly)."""
        return entry_address(self._gemm_silu)

    @staticmethod
    def takes(weight: torch.Tensor) -> bool:
        """Whether this weight can be packed: bfloat16 [N, K] on CPU, K even (read in pairs)."""
        return (
            weight.device.type == "cpu"
            and weight.dtype == torch.bfloat16
            and weight.dim() == 2
            and weight.shape[1] % 2 == 0
        )

    def pack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> PackedBf16:
        """``weight`` bfloat16 [N, K] (K even) in the kernel's layout; ``bias`` [N] or None."""
        if not self.takes(weight):
            raise ValueError(f"bfloat16 CPU weights of even width are packed, got {weight.dtype} {list(weight.shape)}")
        n, k = weight.shape
        packed = self._arena.empty(-(-n // TILE) * TILE * k, torch.bfloat16)
        source = weight.detach().contiguous()
        if self._pack(source.data_ptr(), n, k, packed.data_ptr()) != 0:
            raise RuntimeError(f"packing a bfloat16 weight of shape [{n}, {k}] failed")
        wide_bias = bias.detach().to(torch.float32).contiguous() if bias is not None else None
        return PackedBf16(packed, wide_bias, n, k, self)

    @staticmethod
    def handles(x: torch.Tensor, weight: PackedBf16) -> bool:
        """Whether ``x`` [..., K] can go through ``product``."""
        return x.device.type == "cpu" and x.dtype == torch.bfloat16 and x.shape[-1] == weight.in_features

    def product(self, x: torch.Tensor, weight: PackedBf16) -> torch.Tensor:
        """``x`` [..., K] times the weight (plus its bias): [..., N] bfloat16."""
        return self._run(self._gemm, x, weight, weight.out_features)

    def silu_product(self, x: torch.Tensor, weight: PackedBf16) -> torch.Tensor:
        """``silu(gate) * up`` where [gate | up] is ``product(x, weight)``: [..., N / 2] bfloat16, the
        same bits as the product followed by ``silu.py``'s ``silu_mul``, without writing the product."""
        if not weight.ends_in_silu:
            raise ValueError(f"a gate/up weight of {weight.out_features} channels is not two halves of whole tiles")
        return self._run(self._gemm_silu, x, weight, weight.out_features // 2)

    def _run(self, entry: Callable[..., int], x: torch.Tensor, weight: PackedBf16, width: int) -> torch.Tensor:
        if x.shape[-1] != weight.in_features:
            # nn.Linear's own error, where a reshape would silently regroup the values.
            raise ValueError(f"input of width {x.shape[-1]} for a layer of in_features={weight.in_features}")
        rows = x if x.dim() == 2 else x.reshape(-1, weight.in_features)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        count = rows.shape[0]
        out = torch.empty(count, width, dtype=torch.bfloat16)
        packed, bias = weight.addresses
        status = entry(
            rows.data_ptr(), rows.stride(0), count, weight.in_features, packed, weight.out_features, bias,
            out.data_ptr(), width,
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"bfloat16 product kernel failed with status {status} for shape {tuple(x.shape)}")
        return out if x.dim() == 2 else out.view(*x.shape[:-1], width)


def has_amx() -> bool:
    """Whether this CPU has AMX tiles (oneDNN's bfloat16 products on them beat any AVX-512 kernel)."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return False
    return "amx_bf16" in flags.split()


def build_bf16_gemm(cache_dir: Path | None = None) -> Bf16Gemm | None:
    """The kernel where it builds, this CPU has AVX512-BF16 and no AMX; None otherwise (reason logged)."""
    if has_amx():
        logger.info("this CPU has AMX: bfloat16 layers keep oneDNN's products")
        return None
    missing = "the bfloat16 product kernel is not available: bfloat16 layers keep oneDNN's products"
    # Without reassociation each row is summed in one order in every block size.
    kernel = load_kernel(Bf16Gemm, SOURCE, cache_dir, missing, extra_flags=("-fno-fast-math", "-ffp-contract=off"))
    if kernel is not None and not kernel.available:
        logger.info("this CPU has no AVX512-BF16: bfloat16 layers keep oneDNN's products")
        return None
    return kernel
