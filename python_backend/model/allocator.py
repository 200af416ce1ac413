"""How a process that serves a model keeps its memory: the C heap, and Python's collector.

Owns ``HeapPolicy``, ``keep_freed_memory``, ``HeapKeeper`` (holds what the heap keeps under its
cap), ``release_freed_memory`` and ``freeze_startup_objects``. PyTorch's CPU tensors come from
glibc's ``malloc``, which by default maps large blocks (from 128 KiB, a threshold it raises up to
32 MiB as blocks are freed) with ``mmap`` and unmaps them on ``free``, and trims the heap's free
top. A serving step allocates and frees the same sizes again and again (a prompt's keys and
values, the running batch's buffers as rows join, a step's activations), so each new buffer
arrives as fresh pages, faulted in and zeroed by the kernel one by one on its first write. Under
load the heap now serves blocks up to 32 MiB and keeps what is freed (docs/performance.md, "Page
faults").

What it keeps is capped (``cpu_keep_freed_memory_mb``): glibc trims the heap's top itself above
the cap, and ``HeapKeeper`` gives back the free memory inside the heap (glibc's ``malloc_trim``)
once what is resident beyond what is in use passes the cap, checked at most once a second
between engine steps, so a load spike is not held until the server next goes idle. When the
engine goes idle everything kept goes back, so an idle server does not hold the peak of the last
burst.

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
import resource
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_INT_MAX = (1 << 31) - 1  # mallopt takes an int
_USER_KNOBS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX")
# How often, at most, HeapKeeper reads the heap's figures: mallinfo2 walks every arena's free
# lists under their locks, cheap once a second, not once a step.
CHECK_INTERVAL_S = 1.0


@dataclass(frozen=True)
class HeapPolicy:
    """What glibc is asked to keep: blocks below ``mmap_threshold`` come from the heap, which
    grows ``top_pad`` beyond each request and keeps up to ``keep_cap`` bytes of freed memory."""

    keep_cap: int  # the engine setting cpu_keep_freed_memory_mb, in bytes
    mmap_threshold: int = 32 << 20  # glibc's own ceiling for its dynamic threshold
    top_pad: int = 256 << 20

    @classmethod
    def capped_mb(cls, keep_cap_mb: int) -> HeapPolicy:
        return cls(keep_cap=keep_cap_mb << 20)

    @property
    def trim_threshold(self) -> int:
        """glibc trims the heap's free top above this on a ``free``: the cap itself."""
        return min(self.keep_cap, _INT_MAX)

    @property
    def pad(self) -> int:
        """``top_pad``, no more than the cap: a pad beyond it would be kept past the cap."""
        return min(self.top_pad, self.trim_threshold)


def user_tuned(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` already sets any of glibc's malloc knobs."""
    if any(name in environ for name in _USER_KNOBS):
        return True
    return "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def keep_freed_memory(policy: HeapPolicy, environ: Mapping[str, str] | None = None) -> bool:
    """Apply ``policy`` to this process's glibc heap; True if it was applied.

    Leaves the heap as it is where the environment tunes it already, or the C library is not glibc.
    """
    if user_tuned(os.environ if environ is None else environ):
        logger.info("the environment tunes glibc's malloc: its settings are kept")
        return False
    if not GlibcHeap.available():  # without mallinfo2 what it keeps could not be capped
        return False
    libc = _libc()
    for parameter, value in (
        (_M_MMAP_THRESHOLD, policy.mmap_threshold),
        (_M_TRIM_THRESHOLD, policy.trim_threshold),
        (_M_TOP_PAD, policy.pad),
    ):
        # mallopt returns 1 on success, 0 on a value it refuses (glibc caps the mmap threshold).
        if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) != 1:
            logger.warning("glibc refused mallopt(%d, %d): the heap keeps its defaults for it", parameter, value)
            return False
    logger.info(
        "glibc heap: blocks under %d MiB from the heap, freed memory kept up to %d MiB (pad %d MiB)",
        policy.mmap_threshold >> 20,
        policy.keep_cap >> 20,
        policy.pad >> 20,
    )
    return True


def release_freed_memory() -> bool:
    """Return the heap's free memory to the kernel (glibc's ``malloc_trim``); True if any was.

    For the moment the engine goes idle, after ``keep_freed_memory``; it walks every arena once.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    return bool(_libc().malloc_trim(ctypes.c_size_t(0)))


@dataclass(frozen=True)
class HeapUsage:
    """This process's resident bytes, and the bytes its heap has handed out and not got back."""

    resident: int
    in_use: int


class HeapProbe(Protocol):
    """Reads the heap's figures and gives its free memory back (``GlibcHeap``; a fake in tests)."""

    def usage(self) -> HeapUsage: ...

    def trim(self) -> bool: ...


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (malloc.h, glibc 2.33 and later): every field a size_t.
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


class GlibcHeap:
    """This process's glibc heap: ``mallinfo2`` and ``/proc/self/statm`` read, ``malloc_trim`` given back."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._libc.mallinfo2.restype = _MallInfo2
        self._page = resource.getpagesize()

    @staticmethod
    def available() -> bool:
        """Whether this process runs on a glibc with ``mallinfo2`` (2.33 and later)."""
        return platform.libc_ver()[0] == "glibc" and hasattr(_libc(), "mallinfo2")

    def usage(self) -> HeapUsage:
        info = self._libc.mallinfo2()
        resident = int(Path("/proc/self/statm").read_text().split()[1]) * self._page
        # In use: the arenas' bytes less their free chunks, plus blocks mapped on their own.
        return HeapUsage(resident, info.arena - info.fordblks + info.hblkhd)

    def trim(self) -> bool:
        return bool(self._libc.malloc_trim(ctypes.c_size_t(0)))


class HeapKeeper:
    """Holds the freed memory the heap keeps resident under ``cap`` bytes while requests run.

    Kept is what is resident beyond what the heap has handed out and beyond the rest of the
    process (the weights' pages, Python's own arenas, the libraries), which is taken as it was
    right after the last give-back: resident - in use - that remainder. ``after_pass`` (the
    engine's hook after each pass, on its thread) looks at most every ``interval_s`` and gives
    the free memory back once the kept bytes pass the cap; ``release`` (the engine's idle hook)
    gives it back at once. Each give-back measures the remainder again, so a process that grew
    outside the heap (which a trim cannot shrink) costs one needless trim, not one a second.
    """

    def __init__(
        self,
        cap: int,
        heap: HeapProbe,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        self.cap = cap
        self._heap = heap
        self._clock = clock
        self._interval_s = interval_s
        self._next_check = clock() + interval_s
        self.trims = 0  # give-backs because the cap was passed (idle ones not counted)
        self._outside = 0
        self.release()  # what start-up freed, and the first measure of the remainder

    def kept(self) -> int:
        """The freed bytes the heap holds resident now, as estimated (see the class doc)."""
        usage = self._heap.usage()
        return usage.resident - usage.in_use - self._outside

    def after_pass(self) -> None:
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + self._interval_s
        kept = self.kept()
        if kept > self.cap:
            logger.debug("the heap keeps %d MiB, over its %d MiB cap: given back", kept >> 20, self.cap >> 20)
            self.trims += 1
            self.release()

    def release(self) -> bool:
        """Give every free page back now; True if any was."""
        released = self._heap.trim()
        usage = self._heap.usage()
        self._outside = usage.resident - usage.in_use
        return released


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def freeze_startup_objects() -> int:
    """Take every object alive now out of the cyclic collector's reach; returns how many are.

    For the end of a serving process's start-up. The model's modules, the tokenizer and the
    libraries' imports are a few hundred thousand objects that live as long as the process, and
    each full collection walks all of them: a pause of every running sequence that grows with the
    model's code, not with the work (docs/performance.md, "Python's collector"). Frozen, a full
    collection walks only what was created since, as in vLLM's engine. Cycles already garbage are
    collected first. The model's process never unfreezes them: it ends with the model, and a
    collection of its start-up objects while Triton's stub tears them down crashed the stub.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
