"""The rotary embedding read from a table of the model's own results per position.

Owns ``TabulatedRotary`` and ``tabulable`` (whether a model's rotary embedding can be tabulated).
The model's rotary module computes ``cos``/``sin`` afresh at every call: about ten PyTorch
operations, a tenth of a millisecond, for the one position of a one-user decode step. The table
computes them once per block of positions, with the module itself, and a step gathers its rows.
The blocks also make the values independent of the batch: PyTorch computes ``cos``/``sin`` with
vector code and the tensor's last few elements with the C library's functions, which can differ in
the last bit, and which elements are last depends on the call's shape (the batch-invariant mode,
``batch_invariant.py``, needs exactly that).

May import torch only.
"""

from __future__ import annotations

import torch

# Positions per block of the table: a position is always computed at the same place of a tensor of
# the same shape, and the block stays below PyTorch's threshold for splitting it over threads.
ROTARY_BLOCK = 128


def tabulable(rotary: torch.nn.Module) -> bool:
    """Whether ``rotary``'s results depend on the position alone: not for rope types whose
    frequencies change with the sequence's length (transformers' dynamic and longrope types)."""
    rope_type = getattr(rotary, "rope_type", "default")
    return isinstance(rope_type, str) and "dynamic" not in rope_type and rope_type != "longrope"


class TabulatedRotary(torch.nn.Module):
    """The model's rotary embedding module, read from a table of its own results per position."""

    def __init__(self, rotary: torch.nn.Module) -> None:
        super().__init__()
        self.rotary = rotary
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # cos, sin [positions, D]

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [*position_ids.shape, D] of ``x``'s dtype, as the module gives them."""
        if position_ids.numel() == 1:  # one user's step: a view of the row, no gather
            position = int(position_ids)
            cos, sin = self.table(x, position + 1)
            shape = (*position_ids.shape, cos.shape[-1])
            return cos[position : position + 1].view(shape), sin[position : position + 1].view(shape)
        cos, sin = self.table(x, int(position_ids.max()) + 1)
        flat = position_ids.reshape(-1)
        shape = (*position_ids.shape, cos.shape[-1])
        return cos.index_select(0, flat).view(shape), sin.index_select(0, flat).view(shape)

    def table(self, x: torch.Tensor, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables (cos, sin) [P, D] of ``x``'s dtype for positions 0 to at least ``needed`` - 1."""
        table = self._tables.get(x.dtype)
        if table is not None and table[0].shape[0] >= needed:
            return table
        if table is not None:  # at least doubled: a long answer copies the table a few times, not every block
            needed = max(needed, 2 * table[0].shape[0])
        blocks = [] if table is None else [table]
        for start in range(0 if table is None else table[0].shape[0], needed, ROTARY_BLOCK):
            positions = torch.arange(start, start + ROTARY_BLOCK, device=x.device)[None]
            cos, sin = self.rotary(x, positions)
            blocks.append((cos[0], sin[0]))
        table = (torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks]))
        self._tables[x.dtype] = table
        return table
