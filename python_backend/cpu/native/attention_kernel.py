"""The C decode-attention kernels for bfloat16 and float32 KV caches on CPU: building, loading, calling.

Owns ``build_kernel`` (``decode_attention.c`` through ``native/build.py``: compiled once per
source, flags and CPU into the user's cache) and ``DecodeAttentionKernel`` (the loaded function,
called on torch tensors). Why a kernel of our own: PyTorch has no CPU attention for one query row that reads a
strided bfloat16 cache in place. Its bfloat16 batched matmul copies the cache view before every
product and builds a new oneDNN primitive for every new length, and SDPA's CPU kernel is slower
still for one row; widening the cache to float32 doubles the bytes each step reads. The kernel
reads the bfloat16 rows where they are (docs/performance.md). Over a float32 cache, PyTorch's two
batched matmuls read every key and value row once per product and copy the scores between them;
the kernel's float32 variant reads each row once for all the query heads that share it.

The kernel's parallel regions run on the engine thread's OpenMP team (``native/build.py``).
Without a compiler, or when the build fails, ``build_kernel`` returns None and the engine keeps its
PyTorch attention.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from python_backend.cpu.native.build import bind_functions, entry_address, load_kernel

SOURCE = Path(__file__).with_name("decode_attention.c")
# (query dtype, cache dtype) -> entry point; the output has the query's dtype.
_SYMBOLS = {
    (torch.bfloat16, torch.bfloat16): "triton_chat_decode_attention_bf16",
    (torch.float32, torch.float32): "triton_chat_decode_attention_f32",
    (torch.float32, torch.bfloat16): "triton_chat_decode_attention_f32_bf16kv",  # --kv-cache-dtype bfloat16
}


class KernelError(RuntimeError):
    """The kernel refused its arguments (a shape it does not handle, or no memory)."""


def build_kernel(cache_dir: Path | None = None) -> DecodeAttentionKernel | None:
    """Compile (or reuse) and load the kernel; None, with the reason logged, when it cannot be built."""
    missing = "the decode-attention kernel is not available: using PyTorch's decode attention"
    return load_kernel(DecodeAttentionKernel, SOURCE, cache_dir, missing)


_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_ARGTYPES = (
    *(_PTR, _I64, _I64),  # query
    *(_PTR, _I64, _I64, _I64),  # key
    *(_PTR, _I64, _I64, _I64),  # value
    *(_PTR, _I64),  # mask
    *(_PTR, _I64, _I64),  # out
    *(_I64, _I64, _I64, _I64, _I64),  # batch, heads, kv heads, length, dim
    ctypes.c_float,  # scale
)


class DecodeAttentionKernel:
    """``attend(query, key, value, mask, scaling)`` for one query row per sequence, bfloat16 or
    float32 cache (a float32 query may read a bfloat16 cache)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions = bind_functions(library, _SYMBOLS, _ARGTYPES)

    def entry(self, query: torch.dtype, cache: torch.dtype) -> int:
        """The address of the entry point for these dtypes (``decode_stack.py`` calls it directly)."""
        return entry_address(self._functions[(query, cache)])

    @staticmethod
    def handles(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
        """Whether these tensors are in a form the kernel reads: on CPU, rows contiguous, a bfloat16
        query over a bfloat16 cache or a float32 query over a float32 or bfloat16 cache."""
        return (
            query.device.type == "cpu"
            and key.dtype == value.dtype
            and (query.dtype, key.dtype) in _SYMBOLS
            and query.dim() == 4
            and query.shape[2] == 1
            and key.stride(-1) == 1
            and value.stride(-1) == 1
        )

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        scaling: float,
    ) -> torch.Tensor:
        """``query`` [B, H, 1, D], ``key``/``value`` [B, KV, L, D], ``mask`` [B, L] bool or uint8 (non-zero: attend)
        or None; returns [B, 1, H, D]. Masked runs at the start and the end of a row are not read."""
        batch, heads, _, dim = query.shape
        kv_heads, length = key.shape[1], key.shape[2]
        query = query.contiguous()
        out = torch.empty((batch, 1, heads, dim), dtype=query.dtype)
        keep = mask.to(torch.uint8).contiguous() if mask is not None else None
        status = self._functions[(query.dtype, key.dtype)](
            query.data_ptr(), query.stride(0), query.stride(1),
            key.data_ptr(), key.stride(0), key.stride(1), key.stride(2),
            value.data_ptr(), value.stride(0), value.stride(1), value.stride(2),
            keep.data_ptr() if keep is not None else None, keep.stride(0) if keep is not None else 0,
            out.data_ptr(), out.stride(0), out.stride(2),
            batch, heads, kv_heads, length, dim, float(scaling),
        )  # fmt: skip
        if status != 0:
            raise KernelError(f"decode-attention kernel failed with status {status} for shape {tuple(key.shape)}")
        return out
