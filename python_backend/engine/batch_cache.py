"""The cache layers of one batch of rows: buffers with spare rows and positions, grown rarely.

Owns ``GrowableLayer`` (a transformers cache layer that appends in place into spare capacity, so
a decode step copies nothing, and whose rows join and leave without copying the others) and
``BatchCache`` (the cache the model sees: one such layer per decoder layer). ``kv_cache.py``'s
``KVBatch`` does the row bookkeeping of the running batch on top of them; every prefill has a
``BatchCache`` of its own. Imports torch and transformers' cache classes only.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

_GROWTH = 1.5
_MIN_SPARE = 64


class GrowableLayer(DynamicLayer):
    """A dynamic layer whose keys/values are views into a buffer with spare rows and positions.

    The live window is rows ``[0, rows)`` and positions ``[start, end)`` of the buffer. A decode step
    appends at ``end``; a row joins in a spare row (``add_rows``), and a longer one moves ``start``
    left into spare room; rows leave by moving the last rows into their place (``keep_rows``).
    None of these copies the other rows: only reaching the buffer's end does (the window moves back
    inside the buffer where it fits, else the buffer grows), which the spare room makes rare
    (amortised, like a list's append).
    """

    def __init__(self, storage_dtype: torch.dtype | None = None, reserve_rows: int = 0, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._storage_dtype = storage_dtype  # None: the dtype of the first states written
        # Rows the first buffer has room for. Room costs no memory until a row is written (the
        # pages of an untouched row are never faulted in), and every growth copies every row.
        self._reserve_rows = reserve_rows
        self._buf_k: torch.Tensor | None = None
        self._buf_v: torch.Tensor | None = None
        self._rows = 0
        self._start = 0
        self._end = 0

    @property
    def length(self) -> int:
        return self._end - self._start

    def _reserve(self, like: torch.Tensor, rows: int, left: int, right: int) -> None:
        """Room for ``rows`` rows, ``left`` positions before the window and ``right`` after it."""
        buf = self._buf_k
        if buf is not None and rows <= buf.shape[0] and left <= self._start and self._end + right <= buf.shape[2]:
            return
        # Spare room on the left only where rows have needed it (the running batch's joins).
        new_start = left + _MIN_SPARE if left > self._start else max(left, min(self._start, _MIN_SPARE))
        needed = self.length + right
        if buf is not None and rows <= buf.shape[0] and self._shift(new_start, needed):
            return
        if buf is None:
            row_capacity = max(rows, self._reserve_rows)
        elif rows > buf.shape[0]:
            # An adopted prompt cache (KVBatch.adopt) has one row: its first growth takes the reserve.
            row_capacity = max(rows, int(buf.shape[0] * _GROWTH) + 1, self._reserve_rows)
        else:
            row_capacity = buf.shape[0]
        capacity = new_start + max(needed + _MIN_SPARE, int(needed * _GROWTH))
        shape = (row_capacity, like.shape[1], capacity, like.shape[3])
        dtype = self._storage_dtype or like.dtype
        new_k = torch.empty(shape, dtype=dtype, device=like.device)
        new_v = torch.empty(shape, dtype=dtype, device=like.device)
        if self._buf_k is not None and self._buf_v is not None and self._rows and self.length:
            window = slice(new_start, new_start + self.length)
            new_k[: self._rows, :, window] = self._buf_k[: self._rows, :, self._start : self._end]
            new_v[: self._rows, :, window] = self._buf_v[: self._rows, :, self._start : self._end]
        self._end = new_start + self.length
        self._start = new_start
        self._buf_k, self._buf_v = new_k, new_v

    def _shift(self, new_start: int, needed: int) -> bool:
        """Move the window to ``new_start`` inside the buffer when that leaves room for ``needed``
        positions and the usual spare; False when only a bigger buffer will do.

        The running batch's window slides right (rows that leave trim its left, every step appends
        on its right), so at a steady length it reaches the buffer's end again and again. Moving it
        back copies what a growth would copy, but into pages already in memory, where a new buffer's
        pages are each faulted in and zeroed by the kernel on first write (docs/performance.md).
        """
        assert self._buf_k is not None and self._buf_v is not None  # only called with a buffer
        spare = max(_MIN_SPARE, int(needed * (_GROWTH - 1)))
        gap = abs(new_start - self._start)
        if new_start + needed + spare > self._buf_k.shape[2] or gap < spare:
            return False
        length = self.length
        if self._rows and length:
            # Chunks no longer than the gap never overlap their source; moving left, the lowest
            # positions go first (moving right, the highest), so no chunk overwrites one still to move.
            offsets = list(range(0, length, gap))
            for offset in offsets if new_start < self._start else reversed(offsets):
                count = min(gap, length - offset)
                src = slice(self._start + offset, self._start + offset + count)
                dst = slice(new_start + offset, new_start + offset + count)
                self._buf_k[: self._rows, :, dst] = self._buf_k[: self._rows, :, src]
                self._buf_v[: self._rows, :, dst] = self._buf_v[: self._rows, :, src]
        self._start, self._end = new_start, new_start + length
        return True

    # ``keys``/``values`` are views of the live window. ``append_position`` only marks them stale and
    # they are remade when read: a decode step's one-call layers append to every layer and read no
    # view, and making two per layer was half of that call's Python.
    _stale = False

    @property  # type: ignore[override]
    def keys(self) -> torch.Tensor | None:
        self._current_views()
        return self._keys

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:  # transformers' own writes (reset: None)
        self._current_views()  # the other view is made before this one is replaced
        self._keys = value

    @property  # type: ignore[override]
    def values(self) -> torch.Tensor | None:
        self._current_views()
        return self._values

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._current_views()
        self._values = value

    def _current_views(self) -> None:
        if self._stale:
            self._views()

    def _views(self) -> None:
        assert self._buf_k is not None and self._buf_v is not None  # invariant after _reserve, not input
        self._keys = self._buf_k[: self._rows, :, self._start : self._end]
        self._values = self._buf_v[: self._rows, :, self._start : self._end]
        self._stale = False

    def set_states(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the whole content (used when rows join or leave)."""
        self.device = keys.device
        self.is_initialized = True
        self._buf_k = self._buf_v = None
        self._rows, self._start, self._end = keys.shape[0], 0, 0
        self._reserve(keys, keys.shape[0], 0, keys.shape[-2])
        self._write(keys, values)

    def _write(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        assert self._buf_k is not None and self._buf_v is not None  # invariant after _reserve, not input
        n = keys.shape[-2]
        self._buf_k[: self._rows, :, self._end : self._end + n] = keys
        self._buf_v[: self._rows, :, self._end : self._end + n] = values
        self._end += n
        self._views()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.device = key_states.device
            self.is_initialized = True
        if self._buf_k is None:
            self._rows = key_states.shape[0]
        self._reserve(key_states, self._rows, 0, key_states.shape[-2])
        self._write(key_states, value_states)
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def append_position(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """One more position for every row, claimed: (key buffer, value buffer, the window's start,
        its length), for a caller that writes the new keys and values itself at the window's last
        position.
        ``like`` [rows, heads, 1, dim] gives a first or grown buffer's shape and dtype."""
        if self._buf_k is None:
            raise ValueError("a cache layer takes positions only after its first states")
        self._reserve(like, self._rows, 0, 1)
        self._end += 1
        self._stale = True
        assert self._buf_k is not None and self._buf_v is not None  # invariant after _reserve, not input
        return self._buf_k, self._buf_v, self._start, self.length

    def add_rows(self, keys: torch.Tensor, values: torch.Tensor, copies: int, extend: int) -> None:
        """``copies`` new rows holding ``keys``/``values`` [1, heads, n, dim] at the window's end,
        after the window grows ``extend`` positions to the left (the others' new padding)."""
        rows = self._rows + copies
        self._reserve(keys, rows, extend, 0)
        assert self._buf_k is not None and self._buf_v is not None  # invariant after _reserve, not input
        if extend:
            self._start -= extend
            # Masked, but read by the products: zeros, never stale bits that could be NaN.
            self._buf_k[: self._rows, :, self._start : self._start + extend] = 0
            self._buf_v[: self._rows, :, self._start : self._start + extend] = 0
        first = self._end - keys.shape[-2]
        for buf, states in ((self._buf_k, keys), (self._buf_v, values)):
            buf[self._rows : rows, :, self._start : first] = 0
            buf[self._rows : rows, :, first : self._end] = states
        self._rows = rows
        self._views()

    def keep_rows(self, moves: list[tuple[int, int]], rows: int, trim: int) -> None:
        """Row ``dst`` takes row ``src``'s window for each move, then only the first ``rows`` rows
        and the window's positions from ``trim`` on stay."""
        assert self._buf_k is not None and self._buf_v is not None  # only a filled batch has rows
        window = slice(self._start, self._end)
        for dst, src in moves:
            self._buf_k[dst, :, window] = self._buf_k[src, :, window]
            self._buf_v[dst, :, window] = self._buf_v[src, :, window]
        self._rows = rows
        self._start += trim
        self._views()

    def drop_last(self, count: int) -> None:
        """Forget the last ``count`` positions (rejected speculative drafts); the buffer stays."""
        if count <= 0 or self._buf_k is None or self._buf_v is None:
            return
        self._end -= count
        self._views()

    def reserve(self, rows: int) -> None:
        """Rows the next growth of the buffer makes room for at least."""
        self._reserve_rows = rows

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def storage_dtype(self) -> torch.dtype | None:
        return self._buf_k.dtype if self._buf_k is not None else self._storage_dtype

    def get_seq_length(self) -> int:
        return self.length

    def reset(self) -> None:
        self._buf_k = self._buf_v = None
        self._rows = self._start = self._end = 0
        self._stale = False
        super().reset()


class BatchCache(Cache):
    """A cache of ``GrowableLayer``s; one per prefill, and one for the running batch."""

    def __init__(self, storage_dtype: torch.dtype | None = None, reserve_rows: int = 0) -> None:
        super().__init__(layer_class_to_replicate=GrowableLayer)
        self.storage_dtype = storage_dtype
        self.reserve_rows = reserve_rows  # each layer's first buffer's rows (GrowableLayer)

    def _add_layers(self, count: int) -> None:
        """Layers up to ``count``, each with this cache's dtype and reserve."""
        while len(self.layers) < count:
            self.layers.append(GrowableLayer(self.storage_dtype, self.reserve_rows))

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # transformers' Cache adds the layers a forward reaches as ``layer_class_to_replicate()``,
        # without arguments: a prefill's cache would store the model's dtype whatever it was given.
        self._add_layers(layer_idx + 1)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def layer_states(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for layer in self.layers:
            if not isinstance(layer, GrowableLayer) or layer.keys is None or layer.values is None:
                raise RuntimeError("cache layer is empty or of an unsupported kind")
            out.append((layer.keys, layer.values))
        return out

    def set_layer_states(self, states: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._add_layers(len(states))
        for layer, (keys, values) in zip(self.layers, states, strict=True):
            if not isinstance(layer, GrowableLayer):
                raise TypeError(f"unsupported cache layer {type(layer).__name__}")
            layer.set_states(keys, values)
