"""How a process that serves a model keeps its memory: the C heap, and Python's collector.

Owns ``keep_freed_memory``, ``release_freed_memory`` and ``freeze_startup_objects``. PyTorch's CPU tensors come from glibc's
``malloc``, which by default maps large blocks (from 128 KiB, a threshold it raises up to 32 MiB as
blocks are freed) with ``mmap`` and unmaps them on ``free``, and trims the heap's free top. A
serving step allocates and frees the same sizes again and again (a prompt's keys and values, the
running batch's buffers as rows join, a step's activations), so each new buffer arrives as fresh
pages, faulted in and zeroed by the kernel one by one on its first write. Under load the heap now
serves blocks up to 32 MiB and keeps what is freed (docs/performance.md, "Page faults").

What is kept is given back when the engine goes idle (``release_freed_memory``, glibc's
``malloc_trim``), so an idle server does not hold the peak of the last burst.

A user's own settings win: where the environment already tunes glibc's allocator (``MALLOC_*_``
variables or ``glibc.malloc`` tunables), nothing is changed. With another C library this does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_USER_KNOBS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX")


@dataclass(frozen=True)
class HeapPolicy:
    """What glibc is asked to keep: blocks below ``mmap_threshold`` come from the heap, whose free
    top is trimmed only above ``trim_threshold``, and which grows ``top_pad`` beyond each request."""

    mmap_threshold: int = 32 << 20  # glibc's own ceiling for its dynamic threshold
    trim_threshold: int = (1 << 31) - 1  # mallopt takes an int: about 2 GiB, in effect never
    top_pad: int = 256 << 20


def user_tuned(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` already sets any of glibc's malloc knobs."""
    if any(name in environ for name in _USER_KNOBS):
        return True
    return "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def keep_freed_memory(policy: HeapPolicy | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Apply ``policy`` to this process's glibc heap; True if it was applied.

    Leaves the heap as it is where the environment tunes it already, or the C library is not glibc.
    """
    policy = policy or HeapPolicy()
    if user_tuned(os.environ if environ is None else environ):
        logger.info("the environment tunes glibc's malloc: its settings are kept")
        return False
    libc_name, _ = platform.libc_ver()
    if libc_name != "glibc":
        return False
    libc = _libc()
    for parameter, value in (
        (_M_MMAP_THRESHOLD, policy.mmap_threshold),
        (_M_TRIM_THRESHOLD, policy.trim_threshold),
        (_M_TOP_PAD, policy.top_pad),
    ):
        # mallopt returns 1 on success, 0 on a value it refuses (glibc caps the mmap threshold).
        if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) != 1:
            logger.warning("glibc refused mallopt(%d, %d): the heap keeps its defaults for it", parameter, value)
            return False
    logger.info(
        "glibc heap: blocks under %d MiB from the heap, freed memory kept (trim above %d MiB, pad %d MiB)",
        policy.mmap_threshold >> 20,
        policy.trim_threshold >> 20,
        policy.top_pad >> 20,
    )
    return True


def release_freed_memory() -> bool:
    """Return the heap's free memory to the kernel (glibc's ``malloc_trim``); True if any was.

    For the moment the engine goes idle, after ``keep_freed_memory``; it walks every arena once.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    return bool(_libc().malloc_trim(ctypes.c_size_t(0)))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def freeze_startup_objects() -> int:
    """Take every object alive now out of the cyclic collector's reach; returns how many are.

    For the end of a serving process's start-up. The model's modules, the tokenizer and the
    libraries' imports are a few hundred thousand objects that live as long as the process, and
    each full collection walks all of them: a pause of every running sequence that grows with the
    model's code, not with the work (docs/performance.md, "Python's collector"). Frozen, a full
    collection walks only what was created since, as in vLLM's engine. Cycles already garbage are
    collected first; ``gc.unfreeze`` (at shutdown) gives the rest back to the collector.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
