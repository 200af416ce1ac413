"""Memory for the packed weights a decode step streams, in mappings Linux may back with 2 MiB pages.

Owns ``WeightArena``. A one-row product reads its weight once per step, front to back, and is
bound by the memory's rate only while address translation keeps up with it: in 4 KiB pages a
weight needs a new translation every 64 cache lines, and a step's ~100 MB of weights are far more
pages than the TLB holds, so every page starts with a page walk. The kernels' packed weights are
therefore placed in private anonymous mappings advised ``MADV_HUGEPAGE``: under transparent huge
pages' ``always`` or ``madvise`` mode (most distributions' default) they are backed by 2 MiB pages
(docs/design.md, "CPU speed paths", gives the gain). Small weights share chunks (a weight's tail
page would otherwise cost up to 2 MiB each); large ones get a mapping of their own. Where the
system has no ``MADV_HUGEPAGE`` (not Linux) or refuses it, the memory is the same, in 4 KiB pages.

May import torch only.
"""

from __future__ import annotations

import logging
import mmap

import torch

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGNMENT = 64  # bytes between the starts of two tensors of a chunk: a cache line
_CHUNK = 32 << 20


class WeightArena:
    """``empty(numel, dtype)``: a 1-D tensor for a packed weight that lives as long as the model.

    Nothing is freed one tensor at a time: a mapping is unmapped once no tensor of it is left.
    """

    def __init__(self, chunk_bytes: int = _CHUNK) -> None:
        if chunk_bytes <= 0 or chunk_bytes % HUGE_PAGE:
            raise ValueError(f"chunk_bytes must be a positive multiple of {HUGE_PAGE}, got {chunk_bytes}")
        self._chunk_bytes = chunk_bytes
        self._chunk: mmap.mmap | None = None
        self._next = 0  # the current chunk's first free byte
        self._end = 0  # and its end
        self._advice: int | None = getattr(mmap, "MADV_HUGEPAGE", None)

    def empty(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized tensor of ``numel`` elements, its start aligned to ``ALIGNMENT`` bytes."""
        if numel < 0:
            raise ValueError(f"numel must be at least 0, got {numel}")
        nbytes, advice = numel * dtype.itemsize, self._advice
        if advice is None or nbytes == 0:
            return torch.empty(numel, dtype=dtype)
        if nbytes > self._chunk_bytes // 2:
            region, start = self._map(nbytes, advice)
            return torch.frombuffer(region, dtype=dtype, count=numel, offset=start)
        if self._chunk is None or self._next + nbytes > self._end:
            self._chunk, self._next = self._map(self._chunk_bytes, advice)
            self._end = self._next + self._chunk_bytes
        start = self._next
        self._next = start + -(-nbytes // ALIGNMENT) * ALIGNMENT
        return torch.frombuffer(self._chunk, dtype=dtype, count=numel, offset=start)

    def _map(self, nbytes: int, advice: int) -> tuple[mmap.mmap, int]:
        """A private anonymous mapping with whole 2 MiB pages of ``nbytes`` or more at the returned
        offset, given ``advice`` (``MADV_HUGEPAGE``). The bytes before that offset are never
        touched, so they take no memory."""
        size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE)
        address = torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr()
        start = -address % HUGE_PAGE  # a multiple of the page size: the mapping starts on a page
        try:
            region.madvise(advice, start, size)
        except OSError as exc:  # a kernel without transparent huge pages: 4 KiB pages, as malloc's
            logger.info("weights stay in 4 KiB pages: madvise(MADV_HUGEPAGE) failed (%s)", exc)
            self._advice = None
        return region, start
