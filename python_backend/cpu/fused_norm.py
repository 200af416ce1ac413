"""RMSNorm in one pass per row on CPU, with the residual add before it when there is one.

Owns ``NormKernel`` (``native/rms_norm.c``, built as the attention kernel is), ``FusedRMSNorm`` and
``fuse_norms``. transformers' Llama/Qwen2 RMSNorm is seven PyTorch operations (widen, square,
mean, add, rsqrt, multiply, narrow, then the weight), each a pass over the rows and a dispatch;
with the residual add before it, eight. At the row counts of decode steps and prefill chunks these
passes cost more than the products around them on an AMX CPU (docs/performance.md). The kernel
does the same roundings in the same order in one pass; only the mean's summation order is its
own, so results equal transformers' within float32 rounding.

``fuse_norms`` replaces the decoder's norm modules of exactly those classes, so the model's own
forward and the lean decode step (``fast_decode.py``, which also fuses each residual add into the
norm after it) run the same kernel and stay bit-identical to each other.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import cast

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from python_backend.cpu.native.build import bind_functions, entry_address, load_kernel

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "rms_norm.c"
_SYMBOLS = {torch.bfloat16: "triton_chat_rms_norm_bf16", torch.float32: "triton_chat_rms_norm_f32"}
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = (
    *(_PTR, _I64),  # x
    *(_PTR, _I64),  # delta (or NULL)
    *(_PTR, _I64),  # sum (or NULL)
    _PTR,  # weight
    *(_PTR, _I64),  # out
    *(_I64, _I64),  # rows, dim
    ctypes.c_float,  # eps
)
MAX_DIM = 16384  # rms_norm.c's
_NORM_CLASSES = (LlamaRMSNorm, Qwen2RMSNorm)


class NormKernel:
    """``norm(x, weight, eps, delta)``: RMSNorm of ``x`` (of ``x + delta``, returned too)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions = bind_functions(library, _SYMBOLS, _ARGTYPES)

    def entry(self, dtype: torch.dtype) -> int:
        """The address of ``dtype``'s entry point (``decode_stack.py`` calls it directly)."""
        return entry_address(self._functions[dtype])

    @staticmethod
    def handles(x: torch.Tensor, weight: torch.Tensor) -> bool:
        return (
            x.device.type == "cpu"
            and x.dtype in _SYMBOLS
            and weight.dtype == x.dtype
            and x.shape[-1] == weight.shape[0] <= MAX_DIM
            and weight.is_contiguous()
        )

    def norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the normed rows, ``x + delta`` or None); ``x`` and ``delta`` [..., dim] of one shape."""
        dim = x.shape[-1]
        rows_x = x.reshape(-1, dim)
        if rows_x.stride(-1) != 1:
            rows_x = rows_x.contiguous()
        rows_d = summed = None
        if delta is not None:
            rows_d = delta.reshape(-1, dim)
            if rows_d.stride(-1) != 1:
                rows_d = rows_d.contiguous()
            summed = torch.empty_like(rows_x)
        out = torch.empty((rows_x.shape[0], dim), dtype=x.dtype)
        status = self._functions[x.dtype](
            rows_x.data_ptr(), rows_x.stride(0),
            rows_d.data_ptr() if rows_d is not None else None, rows_d.stride(0) if rows_d is not None else 0,
            summed.data_ptr() if summed is not None else None, summed.stride(0) if summed is not None else 0,
            weight.data_ptr(), out.data_ptr(), out.stride(0), rows_x.shape[0], dim, float(eps),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"RMSNorm kernel failed with status {status} for shape {tuple(x.shape)}")
        shape = x.shape
        return out.view(shape), summed.view(shape) if summed is not None else None


def build_norm_kernel(cache_dir: Path | None = None) -> NormKernel | None:
    """Compile (or reuse) and load the kernel; None, with the reason logged, when it cannot be built."""
    missing = "the RMSNorm kernel is not available: the model keeps transformers' RMSNorm"
    return load_kernel(NormKernel, SOURCE, cache_dir, missing)


class FusedRMSNorm(LlamaRMSNorm):
    """A Llama/Qwen2 RMSNorm (the two compute alike) run by ``NormKernel``; ``add_norm`` adds the
    residual first. Inputs the kernel does not take get transformers' own forward."""

    def __init__(self, norm: LlamaRMSNorm | Qwen2RMSNorm, kernel: NormKernel) -> None:
        super().__init__(norm.weight.shape[0], float(norm.variance_epsilon))
        self.weight = norm.weight
        self.kernel = kernel

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.kernel.handles(hidden, self.weight):
            return super().forward(hidden)
        return self.kernel.norm(hidden, self.weight, self.variance_epsilon)[0]

    def add_norm(self, hidden: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm of ``hidden + delta``, ``hidden + delta``), the sum rounded as PyTorch's add rounds it."""
        if not self.kernel.handles(hidden, self.weight) or delta.dtype != hidden.dtype:
            summed = hidden + delta
            return self.forward(summed), summed
        normed, total = self.kernel.norm(hidden, self.weight, self.variance_epsilon, delta)
        assert total is not None  # a delta was given (an invariant, not input)
        return normed, total


def fuse_norms(decoder: torch.nn.Module, kernel: NormKernel) -> int:
    """Replace the decoder's Llama/Qwen2 RMSNorm modules (exactly those classes); returns how many."""
    replaced = 0
    for name, module in list(decoder.named_modules()):
        if type(module) not in _NORM_CLASSES:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = decoder.get_submodule(parent_name) if parent_name else decoder
        setattr(parent, child, FusedRMSNorm(cast(LlamaRMSNorm, module), kernel))
        replaced += 1
    logger.info("replaced %d RMSNorm layers by the one-pass kernel", replaced)
    return replaced
