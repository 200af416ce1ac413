"""Causal attention of a prompt segment in a mixed step, as two small matrix products per KV head.

Owns ``PromptAttentionKernel`` and ``build_prompt_kernel`` (``native/prompt_attention.c``, built
as the other kernels are). A prompt segment's query rows all read the same keys and values, so
attending one row at a time (the decode kernel's way) spends most of its work on horizontal sums
and reloads; the kernel repacks the segment's keys and values once into AVX512-BF16's pair layout
and computes a dozen query vectors' scores and weighted values per key and value load, with the
softmax weights rounded to bfloat16 for the second product as SDPA's bfloat16 kernels round them.
Only bfloat16 queries over a bfloat16 cache, head sizes that are multiples of 32 up to 256, on a
CPU with AVX512-BF16; everything else keeps the slower paths of ``fast_decode.prompt_attention``.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

from python_backend.cpu.native.attention_kernel import KernelError
from python_backend.cpu.native.build import bind_functions, build_library

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "prompt_attention.c"
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = (
    *(_PTR, _I64, _I64),  # query: rows, heads
    *(_PTR, _I64, _I64),  # key: heads, positions
    *(_PTR, _I64, _I64),  # value: heads, positions
    *(_PTR, _I64, _I64),  # out: rows, heads
    *(_I64, _I64, _I64, _I64, _I64),  # count, past, heads, kv heads, dim
    ctypes.c_float,  # scale
)
MAX_DIM = 256  # prompt_attention.c's


def _pairs_aligned(tensor: torch.Tensor) -> bool:
    """Every row starts on a 4-byte boundary: the kernel reads bfloat16 pairs as 32-bit words."""
    return tensor.data_ptr() % 4 == 0 and all(stride % 2 == 0 for stride in tensor.stride()[:-1])


class PromptAttentionKernel:
    """``attend(query, key, value, scale)``: causal attention of a segment's queries [1, H, T, D]
    over the last T of its cache's positions [1, KV, P + T, D]; returns [T, H * D]."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._function = bind_functions(library, {torch.bfloat16: "triton_chat_prompt_attention_bf16"}, _ARGTYPES)[
            torch.bfloat16
        ]

    @staticmethod
    def handles(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
        dim = query.shape[-1]
        return (
            query.device.type == "cpu"
            and query.dtype == key.dtype == value.dtype == torch.bfloat16
            and query.dim() == key.dim() == value.dim() == 4
            and query.shape[0] == key.shape[0] == 1
            and key.shape == value.shape
            and key.shape[2] >= query.shape[2] > 0
            and query.shape[1] % key.shape[1] == 0
            and dim == key.shape[-1]
            and dim % 32 == 0
            and dim <= MAX_DIM
            and query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
            and _pairs_aligned(query)
            and _pairs_aligned(key)
            and _pairs_aligned(value)
        )

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
        heads, count, dim = query.shape[1], query.shape[2], query.shape[3]
        kv_heads, total = key.shape[1], key.shape[2]
        out = torch.empty((count, heads, dim), dtype=query.dtype)
        status = self._function(
            query.data_ptr(), query.stride(2), query.stride(1),
            key.data_ptr(), key.stride(1), key.stride(2),
            value.data_ptr(), value.stride(1), value.stride(2),
            out.data_ptr(), out.stride(0), out.stride(1),
            count, total - count, heads, kv_heads, dim, float(scale),
        )  # fmt: skip
        if status != 0:
            raise KernelError(f"prompt-attention kernel failed with status {status} for shape {tuple(key.shape)}")
        return out.view(count, heads * dim)


def build_prompt_kernel(cache_dir: Path | None = None) -> PromptAttentionKernel | None:
    """Compile (or reuse) and load the kernel; None, with the reason logged, when it cannot be built
    or this CPU has no AVX512-BF16."""
    library = build_library(SOURCE, cache_dir)
    if library is None:
        logger.warning("the prompt-attention kernel is not available: prompts attend through the decode kernel")
        return None
    available = library.triton_chat_prompt_attention_available
    available.restype = ctypes.c_int
    if not available():
        logger.info("no AVX512-BF16 on this CPU: prompts attend through the decode kernel")
        return None
    return PromptAttentionKernel(library)
