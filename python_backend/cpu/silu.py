"""SiLU of bfloat16 or float32 rows on CPU in one pass, alone (the model's MLP) or times the up projection.

Owns ``SiluKernel`` (``native/silu.c``), ``NativeSiLU`` and ``fuse_silu``. PyTorch's SiLU and the
product after it are two passes and two dispatches per layer; the lean decode step
(``fast_decode.py``) and its one-call layers (``decode_stack.py``) take both in one pass of the
kernel. Its exp is its own (within 2 ulp of float32, before the bfloat16 rounding for bfloat16
rows), so, as with the norms (``fused_norm.py``), the model's own SiLU modules are replaced by the
same kernel: the model's forward, the lean step and the one-call layers then agree bit for bit.
Bfloat16 rows need AVX-512, float32 rows AVX2 with FMA (``native/silu.c``).

May import torch, transformers' Llama/Qwen2 MLPs and ``python_backend.cpu.native`` only.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any

import torch

from python_backend.cpu.native.build import bind_functions, entry_address, load_kernel

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "silu.c"
# Each division and product rounded as PyTorch rounds it.
FLAGS = ("-fno-fast-math", "-ffp-contract=off")
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES: list[Any] = [_PTR, _I64, _PTR, _I64, _I64, _I64]  # input and its row stride, out and its, rows, width
_SILU = {torch.bfloat16: "triton_chat_silu_bf16", torch.float32: "triton_chat_silu_f32"}
_SILU_MUL = {torch.bfloat16: "triton_chat_silu_mul_bf16", torch.float32: "triton_chat_silu_mul_f32"}
_DTYPE_BITS = {torch.bfloat16: 1, torch.float32: 2}  # native/silu.c's triton_chat_silu_dtypes


class SiluKernel:
    """``silu(x)`` and ``silu_mul(gate_up)`` for the row dtypes this CPU's build has (``dtypes``)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        built = library.triton_chat_silu_dtypes
        built.restype, built.argtypes = ctypes.c_int, []
        bits = int(built())
        self.dtypes = frozenset(dtype for dtype, bit in _DTYPE_BITS.items() if bits & bit)
        self._silu = bind_functions(library, _SILU, _ARGTYPES)
        self._silu_mul = bind_functions(library, _SILU_MUL, _ARGTYPES)

    def silu_mul_entry(self, dtype: torch.dtype) -> int:
        """The address of ``silu_mul`` for rows of ``dtype`` (``decode_stack.py`` calls it directly)."""
        return entry_address(self._silu_mul[dtype])

    def handles(self, x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype in self.dtypes and x.dim() >= 1 and x.shape[-1] > 0

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU of ``x`` [..., dim] (a dtype of ``dtypes``), as a new contiguous tensor."""
        width = x.shape[-1]
        rows = x.reshape(-1, width)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty(rows.shape, dtype=x.dtype)
        status = self._silu[x.dtype](rows.data_ptr(), rows.stride(0), out.data_ptr(), width, rows.shape[0], width)
        if status != 0:
            raise RuntimeError(f"SiLU kernel failed with status {status} for shape {tuple(x.shape)}")
        return out.view(x.shape)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of ``gate_up`` [..., 2 * dim] (gate first, as merged): [..., dim]."""
        width = gate_up.shape[-1] // 2
        rows = gate_up.reshape(-1, 2 * width)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty((rows.shape[0], width), dtype=gate_up.dtype)
        run = self._silu_mul[gate_up.dtype]
        status = run(rows.data_ptr(), rows.stride(0), out.data_ptr(), width, rows.shape[0], width)
        if status != 0:
            raise RuntimeError(f"SiLU kernel failed with status {status} for shape {tuple(gate_up.shape)}")
        return out.view(*gate_up.shape[:-1], width)


def build_silu_kernel(dtype: torch.dtype, cache_dir: Path | None = None) -> SiluKernel | None:
    """The kernel where it builds and this CPU runs it on ``dtype`` rows (bfloat16: AVX-512, float32:
    AVX2 and FMA); None otherwise (the reason logged)."""
    missing = "the SiLU kernel is not available: the model keeps PyTorch's SiLU"
    kernel = load_kernel(SiluKernel, SOURCE, cache_dir, missing, FLAGS)
    if kernel is not None and dtype not in kernel.dtypes:
        logger.info("the SiLU kernel has no %s build for this CPU: the model keeps PyTorch's SiLU", dtype)
        return None
    return kernel


class NativeSiLU(torch.nn.Module):
    """An MLP's SiLU run by ``SiluKernel``; other inputs (dtypes, devices) get PyTorch's."""

    def __init__(self, kernel: SiluKernel) -> None:
        super().__init__()
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.kernel.handles(x):
            return torch.nn.functional.silu(x)
        return self.kernel.silu(x)


def fuse_silu(decoder: torch.nn.Module, kernel: SiluKernel) -> int:
    """Replace the SiLU of every Llama/Qwen2 MLP of ``decoder``; returns how many."""
    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    replaced = 0
    for module in decoder.modules():
        if type(module) in (LlamaMLP, Qwen2MLP) and getattr(module.config, "hidden_act", None) == "silu":
            module.act_fn = NativeSiLU(kernel)
            replaced += 1
    logger.info("replaced the SiLU of %d MLPs by the one-pass kernel", replaced)
    return replaced
