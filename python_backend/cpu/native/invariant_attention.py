"""The batch-invariant attention kernel for CPUs: building, loading and calling it.

Owns ``build_invariant_kernel`` (``invariant_attention.c`` through ``native/build.py``, without
``-ffast-math`` so that the compiler keeps the source's order of additions) and
``InvariantAttentionKernel``, one function for prefill and decode: each query's scores, softmax
and weighted sum run over its own visible keys in ascending order, so its result does not depend
on how many queries, sequences or padding positions share the call (the C file says how).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from python_backend.cpu.native.build import bind_functions, load_kernel

SOURCE = Path(__file__).with_name("invariant_attention.c")
# Fast-math would let the compiler reassociate sums (differently for different loop lengths), and
# contracting a*b+c into one FMA in some loop versions and not others would change the rounding.
EXTRA_FLAGS = ("-fno-fast-math", "-ffp-contract=off")
_SYMBOLS = {
    torch.float32: "triton_chat_invariant_attention_f32",
    torch.bfloat16: "triton_chat_invariant_attention_bf16",
}

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_ARGTYPES = (
    *(_PTR, _I64, _I64, _I64),  # query
    *(_PTR, _I64, _I64, _I64),  # key
    *(_PTR, _I64, _I64, _I64),  # value
    *(_PTR, _I64, _I64),  # mask
    *(_PTR, _I64, _I64, _I64),  # out
    *(_I64, _I64, _I64, _I64, _I64, _I64),  # batch, heads, kv heads, queries, length, dim
    ctypes.c_float,  # scale
)


class InvariantKernelError(RuntimeError):
    """The kernel refused its arguments (a shape it does not handle, or no memory)."""


def build_invariant_kernel(cache_dir: Path | None = None) -> InvariantAttentionKernel | None:
    """Compile (or reuse) and load the kernel; None, with the reason logged, when it cannot be built."""
    missing = "the batch-invariant attention kernel is not available"
    return load_kernel(InvariantAttentionKernel, SOURCE, cache_dir, missing, EXTRA_FLAGS)


class InvariantAttentionKernel:
    """``attend(query, key, value, mask, scaling)`` with a per-query order fixed by its own keys."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions = bind_functions(library, _SYMBOLS, _ARGTYPES)

    @staticmethod
    def dtypes() -> tuple[torch.dtype, ...]:
        return tuple(_SYMBOLS)

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        scaling: float,
    ) -> torch.Tensor:
        """``query`` [B, H, Q, D], ``key``/``value`` [B, KV, L, D], ``mask`` [B, Q, L] (True = visible;
        None: causal, the queries being the last L positions' last Q); returns [B, Q, H, D]."""
        batch, heads, queries, dim = query.shape
        kv_heads, length = key.shape[1], key.shape[2]
        function = self._functions.get(query.dtype)
        if function is None or not (query.dtype == key.dtype == value.dtype) or query.device.type != "cpu":
            raise InvariantKernelError(
                f"batch-invariant attention takes float32 or bfloat16 CPU tensors of one dtype, got "
                f"{query.dtype}/{key.dtype}/{value.dtype} on {query.device}"
            )
        if queries > length or (mask is not None and tuple(mask.shape) != (batch, queries, length)):
            raise InvariantKernelError(
                f"mask {None if mask is None else tuple(mask.shape)} for {queries} queries over {length} keys"
            )
        query = query if query.stride(-1) == 1 else query.contiguous()
        key = key if key.stride(-1) == 1 else key.contiguous()
        value = value if value.stride(-1) == 1 else value.contiguous()
        keep = mask.to(torch.uint8).contiguous() if mask is not None else None
        out = torch.empty((batch, queries, heads, dim), dtype=query.dtype)
        status = function(
            query.data_ptr(), query.stride(0), query.stride(1), query.stride(2),
            key.data_ptr(), key.stride(0), key.stride(1), key.stride(2),
            value.data_ptr(), value.stride(0), value.stride(1), value.stride(2),
            keep.data_ptr() if keep is not None else None,
            keep.stride(0) if keep is not None else 0, keep.stride(1) if keep is not None else 0,
            out.data_ptr(), out.stride(0), out.stride(1), out.stride(2),
            batch, heads, kv_heads, queries, length, dim, float(scaling),
        )  # fmt: skip
        if status != 0:
            raise InvariantKernelError(f"batch-invariant attention failed with status {status} for {tuple(key.shape)}")
        return out
