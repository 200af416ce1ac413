"""Rotary position embedding of a step's query and key heads in one pass on CPU.

Owns ``RopeKernel`` and ``build_rope_kernel`` (``native/rope.c``). The lean decode step rotates
the query and key heads together as ``(x * cos) + (rotate_half(x) * sin)``: five PyTorch
operations and a concatenation, each a pass over every head of every token. The kernel does the
same operations with the same roundings in one pass, so its result is bit-identical to them (and
so to the model's own ``apply_rotary_pos_emb``); tensors in another layout keep PyTorch's code.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from python_backend.cpu.native.build import bind_functions, entry_address, load_kernel

SOURCE = Path(__file__).with_name("native") / "rope.c"
# IEEE arithmetic, no contraction: PyTorch rounds each product before the sum.
FLAGS = ("-fno-fast-math", "-ffp-contract=off")
_SYMBOLS = {torch.bfloat16: "triton_chat_rope_bf16", torch.float32: "triton_chat_rope_f32"}
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = (_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64)  # x, its token stride, cos, sin, out, sizes
MAX_DIM = 1024  # rope.c's


class RopeKernel:
    """``rotate(x, cos, sin)``: x [1, N, heads, D] rotated by cos/sin [1, N, 1, D], as a new tensor."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions = bind_functions(library, _SYMBOLS, _ARGTYPES)

    def entry(self, dtype: torch.dtype) -> int:
        """The address of ``dtype``'s entry point (``decode_stack.py`` calls it directly)."""
        return entry_address(self._functions[dtype])

    @staticmethod
    def handles(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        """Whether these are in the layout the kernel reads: one sequence of tokens on CPU, each
        token's heads adjacent and contiguous, cos and sin one contiguous row per token."""
        dim = x.shape[-1]
        return (
            x.device.type == "cpu"
            and x.dtype in _SYMBOLS
            and cos.dtype == sin.dtype == x.dtype
            and x.dim() == 4
            and x.shape[0] == 1
            and dim % 2 == 0
            and dim <= MAX_DIM
            and x.stride(-1) == 1
            and x.stride(-2) == dim
            and cos.shape == sin.shape == (1, x.shape[1], 1, dim)
            and cos.is_contiguous()
            and sin.is_contiguous()
        )

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        tokens, heads, dim = x.shape[1], x.shape[2], x.shape[3]
        out = torch.empty((1, tokens, heads, dim), dtype=x.dtype)
        status = self._functions[x.dtype](
            x.data_ptr(), x.stride(1), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), tokens, heads, dim
        )
        if status != 0:
            raise RuntimeError(f"rotary-embedding kernel failed with status {status} for shape {tuple(x.shape)}")
        return out


def build_rope_kernel(cache_dir: Path | None = None) -> RopeKernel | None:
    """Compile (or reuse) and load the kernel; None, with the reason logged, when it cannot be built."""
    missing = "the rotary-embedding kernel is not available: the lean decode step keeps PyTorch's"
    return load_kernel(RopeKernel, SOURCE, cache_dir, missing, FLAGS)
