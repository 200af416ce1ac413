"""The running batch's KV cache: one left-padded tensor per layer, rows joining and leaving.

Owns: ``GrowableLayer`` (a transformers cache layer that appends in place into spare capacity, so
a decode step copies nothing), ``BatchCache`` (the cache the model sees) and the row operations
continuous batching needs: add a freshly prefilled request, drop finished rows, trim padding.

Rows are left-padded to a common length; ``pad[i]`` says how many leading positions of row ``i``
are padding, and ``attention_mask()`` masks them, so every row attends to its own tokens only.
Joining and leaving copy only the rows that join or move (``GrowableLayer``): at 64 rows of ~500
positions, copying the whole batch for every join and leave cost more than the decode steps.
A speculative step appends the same number of positions to every row and then keeps only what
each row accepted (``drop_rejected``): the rejection common to all rows is cut off the end, the
rest become holes, masked like padding, until ``compact`` moves every row's real positions
together again (when holes grow, and before a finished row's keys/values are read out).

The running batch may store keys and values in a wider dtype than the model's (``storage_dtype``):
on CPU, a bfloat16 model's decode attention is 2-5x faster over a float32 cache (attention.py).
Prefill caches always hold the model's dtype; rows are converted when they join the batch.
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
    None of these copies the other rows: only a growth past the buffer's room does, which the
    spare room makes rare (amortised, like a list's append).
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
        if buf is None:
            row_capacity = max(rows, self._reserve_rows)
        elif rows > buf.shape[0]:
            # An adopted prompt cache (KVBatch.adopt) has one row: its first growth takes the reserve.
            row_capacity = max(rows, int(buf.shape[0] * _GROWTH) + 1, self._reserve_rows)
        else:
            row_capacity = buf.shape[0]
        # Spare room on the left only where rows have needed it (the running batch's joins).
        new_start = left + _MIN_SPARE if left > self._start else max(left, min(self._start, _MIN_SPARE))
        needed = self.length + right
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

    def _views(self) -> None:
        assert self._buf_k is not None and self._buf_v is not None  # invariant after _reserve, not input
        self.keys = self._buf_k[: self._rows, :, self._start : self._end]
        self.values = self._buf_v[: self._rows, :, self._start : self._end]

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
        super().reset()


class BatchCache(Cache):
    """A cache of ``GrowableLayer``s; one per prefill, and one for the running batch."""

    def __init__(self, storage_dtype: torch.dtype | None = None, reserve_rows: int = 0) -> None:
        super().__init__(layer_class_to_replicate=GrowableLayer)
        self.storage_dtype = storage_dtype
        self.reserve_rows = reserve_rows  # each layer's first buffer's rows (GrowableLayer)

    def layer_states(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for layer in self.layers:
            if not isinstance(layer, GrowableLayer) or layer.keys is None or layer.values is None:
                raise RuntimeError("cache layer is empty or of an unsupported kind")
            out.append((layer.keys, layer.values))
        return out

    def set_layer_states(self, states: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        while len(self.layers) < len(states):
            self.layers.append(GrowableLayer(self.storage_dtype, self.reserve_rows))
        for layer, (keys, values) in zip(self.layers, states, strict=True):
            if not isinstance(layer, GrowableLayer):
                raise TypeError(f"unsupported cache layer {type(layer).__name__}")
            layer.set_states(keys, values)


def _repeated(
    states: list[tuple[torch.Tensor, torch.Tensor]], copies: int, dtype: torch.dtype | None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``copies`` rows of each state as broadcast views, not copies: ``set_layer_states`` writes
    them into the layers' own buffers, the only copy (a 2k-token prompt's keys and values are 46 MB
    for the demo model, and a second copy's fresh pages cost tens of milliseconds to fault in)."""
    return [
        (k.to(dtype or k.dtype).expand(copies, -1, -1, -1), v.to(dtype or v.dtype).expand(copies, -1, -1, -1))
        for k, v in states
    ]


def left_pad(tensor: torch.Tensor, amount: int) -> torch.Tensor:
    """``amount`` zero positions in front of [rows, heads, positions, dim] keys or values."""
    if amount == 0:
        return tensor
    zeros = torch.zeros(
        (tensor.shape[0], tensor.shape[1], amount, tensor.shape[3]), dtype=tensor.dtype, device=tensor.device
    )
    return torch.cat([zeros, tensor], dim=-2)


class KVBatch:
    """The running batch's cache with per-row left padding."""

    def __init__(self, storage_dtype: torch.dtype | None = None, reserve_rows: int = 0) -> None:
        self.storage_dtype = storage_dtype
        self.reserve_rows = reserve_rows  # the most rows it is expected to hold (max_num_seqs)
        self.cache = BatchCache(storage_dtype, reserve_rows)
        self.pad: list[int] = []
        self._holes: torch.Tensor | None = None  # [rows, length] bool, True = rejected position

    @property
    def rows(self) -> int:
        return len(self.pad)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length() if self.pad else 0

    def bytes_used(self) -> int:
        if not self.pad:
            return 0
        return sum(k.numel() * k.element_size() * 2 for k, _ in self.cache.layer_states())

    @staticmethod
    def row_states(cache: BatchCache, row: int, pad: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``row`` of a cache without its ``pad`` leading positions, per layer
        ([1, heads, positions, dim] views)."""
        return [(k[row : row + 1, :, pad:], v[row : row + 1, :, pad:]) for k, v in cache.layer_states()]

    def add_states(self, states: list[tuple[torch.Tensor, torch.Tensor]], copies: int, pad: int = 0) -> None:
        """Append ``copies`` rows holding one sequence's keys/values ([1, heads, positions, dim]);
        n > 1 choices share one prefill.

        ``pad`` leading positions are padding from a batched prefill; they are dropped here, and
        the row is re-padded to the running batch's length. The other rows are not copied.
        """
        dtype = self.storage_dtype
        new_states = [(k[:, :, pad:], v[:, :, pad:]) for k, v in states]
        new_len = new_states[0][0].shape[-2]
        if not self.pad:
            self.cache = BatchCache(self.storage_dtype, self.reserve_rows)
            self.cache.set_layer_states(_repeated(new_states, copies, dtype))
            self.pad = [0] * copies
            self._holes = None
            return
        old_len = self.length
        extend = max(0, new_len - old_len)
        for layer, (k, v) in zip(self.cache.layers, new_states, strict=True):
            if not isinstance(layer, GrowableLayer):
                raise TypeError(f"unsupported cache layer {type(layer).__name__}")
            layer.add_rows(k, v, copies, extend)
        if self._holes is not None:
            before = torch.zeros((self.rows, extend), dtype=torch.bool)
            after = torch.zeros((copies, extend + self._holes.shape[1]), dtype=torch.bool)
            self._holes = torch.cat([torch.cat([before, self._holes], dim=1), after], dim=0)
        total = old_len + extend
        self.pad = [p + extend for p in self.pad] + [total - new_len] * copies

    def adopt(self, cache: BatchCache) -> bool:
        """Make ``cache`` (one sequence's prefill cache, one row, no padding) the whole batch, which
        must be empty, without copying it; False, changing nothing, where it cannot be.

        The usual join copies the prompt's keys and values into a new buffer with room for
        ``reserve_rows`` rows, whose fresh pages cost more than the copy (a 2k-token prompt of the
        demo model: 46 MB, 22-70 ms); a batch that starts from one request can take the prompt's
        own buffer instead, and its first growth makes the room.
        """
        layers = cache.layers
        if self.pad or not layers or any(type(layer) is not GrowableLayer for layer in layers):
            return False
        grow = [layer for layer in layers if isinstance(layer, GrowableLayer)]
        wanted = self.storage_dtype
        if any(layer.rows != 1 or (wanted is not None and layer.storage_dtype != wanted) for layer in grow):
            return False
        for layer in grow:
            layer.reserve(self.reserve_rows)
        cache.reserve_rows = self.reserve_rows
        self.cache = cache
        self.pad = [0]
        self._holes = None
        return True

    def keep(self, rows: list[int]) -> list[int]:
        """Keep only ``rows`` and drop padding no row needs any more; returns the old index of each
        row now in the batch, in its new order (the last rows move into the places of those that
        left, so that no other row is copied)."""
        if rows == list(range(self.rows)):
            return rows
        if not rows:
            self.cache = BatchCache(self.storage_dtype, self.reserve_rows)
            self.pad = []
            self._holes = None
            return []
        kept, count = set(rows), len(rows)
        slots = [i for i in range(count) if i not in kept]
        sources = [i for i in range(count, self.rows) if i in kept]
        order = list(range(count))
        for slot, source in zip(slots, sources, strict=True):
            order[slot] = source
        pad = [self.pad[i] for i in order]
        trim = min(pad)
        moves = list(zip(slots, sources, strict=True))
        for layer in self.cache.layers:
            if not isinstance(layer, GrowableLayer):
                raise TypeError(f"unsupported cache layer {type(layer).__name__}")
            layer.keep_rows(moves, count, trim)
        if self._holes is not None:
            holes = self._holes.index_select(0, torch.tensor(order, dtype=torch.long))[:, trim:]
            self._holes = holes if bool(holes.any()) else None
        self.pad = [p - trim for p in pad]
        return order

    def drop_rejected(self, rejected: list[int]) -> None:
        """After a step that appended the same number of positions to every row, forget the
        last ``rejected[i]`` of row ``i``: what all rows rejected is cut off, the rest masked."""
        common = min(rejected)
        if common:
            for layer in self.cache.layers:
                if isinstance(layer, GrowableLayer):
                    layer.drop_last(common)
        extra = [r - common for r in rejected]
        if not any(extra):
            return
        length = self.length
        self._holes = self._holes_up_to(length)
        for i, count in enumerate(extra):
            if count:
                self._holes[i, length - count :] = True

    def _holes_up_to(self, length: int) -> torch.Tensor:
        """The holes as a [rows, length] mask (positions appended since the last hole are none)."""
        holes = self._holes if self._holes is not None else torch.zeros((self.rows, 0), dtype=torch.bool)
        if holes.shape[1] == length:
            return holes
        return torch.cat([holes, torch.zeros((self.rows, length - holes.shape[1]), dtype=torch.bool)], dim=1)

    @property
    def hole_count(self) -> int:
        """Masked positions of the row that has the most (0 without holes)."""
        return int(self._holes.sum(dim=1).max()) if self._holes is not None else 0

    def compact(self) -> None:
        """Move every row's real positions together (left-padded again, no holes)."""
        if self._holes is None:
            return
        length = self.length
        real = ~self._holes_up_to(length)
        for i, p in enumerate(self.pad):
            real[i, :p] = False
        counts = real.sum(dim=1)
        new_length = int(counts.max())
        # Row i reads its real positions in order, after new_length - counts[i] padding slots;
        # those read position 0 of the row: finite values that the mask hides.
        index = torch.zeros((self.rows, new_length), dtype=torch.long)
        for i in range(self.rows):
            positions = torch.arange(length)[real[i]]
            index[i, new_length - positions.numel() :] = positions
        states = []
        for k, v in self.cache.layer_states():
            gather = index.to(k.device)[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            states.append((torch.gather(k, 2, gather), torch.gather(v, 2, gather)))
        self.pad = [new_length - int(c) for c in counts]
        self._holes = None
        self.cache.set_layer_states(states)

    def copy_rows(self, dst: list[int], src: list[int]) -> None:
        """Row ``dst[i]`` takes the content of row ``src[i]`` (beam search); pads must agree."""
        if dst == src:
            return
        index = torch.tensor(src, dtype=torch.long)
        target = torch.tensor(dst, dtype=torch.long)
        for k, v in self.cache.layer_states():
            # The states are views of each layer's buffer: assigning through them writes in place,
            # and index_select copies the sources first, so overlapping moves are safe.
            k[target.to(k.device)] = k.index_select(0, index.to(k.device))
            v[target.to(v.device)] = v.index_select(0, index.to(v.device))
        if self._holes is not None:
            self._holes[target] = self._holes.index_select(0, index)

    @property
    def padded(self) -> bool:
        """Whether some position must be masked (padding or holes)."""
        return any(self.pad) or self._holes is not None

    def attention_mask(self, extra: int, device: torch.device) -> torch.Tensor:
        """[rows, length + extra] mask: 0 on each row's padding and holes, 1 elsewhere."""
        length = self.length + extra
        mask = torch.ones((self.rows, length), dtype=torch.long)
        for i, p in enumerate(self.pad):
            if p:
                mask[i, :p] = 0
        if self._holes is not None:
            mask[:, : self._holes.shape[1]].masked_fill_(self._holes, 0)
        return mask.to(device)
