"""The running batch's KV cache: one left-padded tensor per layer, rows joining and leaving.

Owns ``KVBatch``: the row operations continuous batching needs over a ``BatchCache``
(``batch_cache.py``): add a freshly prefilled request, drop finished rows, trim padding.

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

from python_backend.engine.batch_cache import BatchCache, GrowableLayer


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
