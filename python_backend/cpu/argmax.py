"""The first index of each row's maximum on CPU: greedy sampling's read of the logits.

Owns ``RowArgmax`` (``native/argmax.c``) and ``build_row_argmax``. PyTorch's ``max(dim=1)`` took
2.7 ms for 64 rows of a 49k vocabulary on the test machine, as much as the rest of the step's
sampling and detokenizing together; the kernel reads the same logits at memory speed and returns
the same indices (the first of equal maxima; a row with a NaN is handed back to PyTorch).

May import torch and ``python_backend.cpu.native`` only.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from python_backend.cpu.native.build import load_kernel

SOURCE = Path(__file__).with_name("native") / "argmax.c"
# NaN must stay NaN for the row check, and the keys' comparisons exact.
FLAGS = ("-fno-fast-math",)
_WIDTHS = {torch.bfloat16: 2, torch.float32: 4}


class RowArgmax:
    """``first_max(logits)``: each row's argmax, as ``torch.max(logits, dim=1).indices`` gives it."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._argmax = library.triton_chat_argmax
        self._argmax.restype = ctypes.c_int
        self._argmax.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int,
            ctypes.c_void_p,
        ]

    def first_max(self, logits: torch.Tensor) -> list[int]:
        """The index of each row's first maximum of ``logits`` [rows, vocab]."""
        width = _WIDTHS.get(logits.dtype)
        if width is None or logits.device.type != "cpu" or logits.dim() != 2 or logits.stride(-1) != 1:
            return torch.max(logits, dim=1).indices.tolist()
        rows, cols = logits.shape
        out = torch.empty(rows, dtype=torch.int64)
        status = self._argmax(logits.data_ptr(), logits.stride(0), rows, cols, width, out.data_ptr())
        if status != 0:
            raise RuntimeError(f"argmax kernel failed with status {status} for shape {tuple(logits.shape)}")
        best = out.tolist()
        # A row holding a NaN: PyTorch's answer (its maximum is the NaN).
        return [int(torch.max(logits[r], dim=0).indices) if b < 0 else b for r, b in enumerate(best)]


def build_row_argmax(cache_dir: Path | None = None) -> RowArgmax | None:
    """The kernel where it builds; None otherwise (the reason logged): greedy rows keep PyTorch's max."""
    missing = "the argmax kernel is not available: greedy sampling keeps PyTorch's max"
    return load_kernel(RowArgmax, SOURCE, cache_dir, missing, extra_flags=FLAGS)
