"""Matrix products computed a fixed number of rows at a time (the batch-invariant mode's linear layers).

Owns ``row_tiled``, ``packed_product`` (a prepacked oneDNN product, tiled or not), ``PackedProduct``
(the module both prepacked layers build on: oneDNN's layout or our bfloat16 kernel's) and
``TiledLinear``. oneDNN and MKL choose a kernel, and with it the order in
which a row's sum over the input features is added up, from the shape of the product: the row
count M above all. Prefill (M = prompt tokens) and decode (M = running sequences) then round the
same row differently, and a sequence's output changes with the batch it runs in or with whether
its prompt came from the prefix cache. Here every product has the same shape, ``rows`` by the
layer's width: shorter inputs are padded with zero rows, longer ones cut into such tiles, so a
row always goes through the one kernel chosen for that shape. That kernel computes each row of
its tile from that row alone (nothing in a GEMM mixes rows), which the tests check by moving a
row around inside the tile.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_backend.cpu.bf16_gemm import Bf16Gemm, PackedBf16

# Where the slices of a tile buffer start: a kernel may take another path for a misaligned row.
_ALIGN_BYTES = 64


def row_tiled(product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int) -> torch.Tensor:
    """``product(x)`` for ``x`` [..., K], computed ``rows`` rows at a time."""
    width = x.shape[-1]
    flat = x.reshape(-1, width)
    count = flat.shape[0]
    padded = -(-count // rows) * rows
    if padded != count or not flat.is_contiguous() or flat.data_ptr() % _ALIGN_BYTES:
        buffer = flat.new_zeros((padded, width))
        buffer[:count] = flat
        flat = buffer
    parts = [product(flat[start : start + rows]) for start in range(0, padded, rows)]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out[:count].reshape(*x.shape[:-1], out.shape[-1])


def packed_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, row_tile: int) -> torch.Tensor:
    """``x W^T + b`` with ``W`` in oneDNN's blocked layout; ``row_tile`` rows at a time when > 0."""
    if row_tile:
        return row_tiled(lambda tile: packed_product(tile, weight, bias, 0), x, row_tile)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class TiledLinear(torch.nn.Linear):
    """An ``nn.Linear`` (the same parameters) whose product runs ``rows`` rows at a time.

    It stays an ``nn.Linear``, so code that reads ``.weight`` (LoRA, tied embeddings) is unchanged.
    """

    def __init__(self, linear: torch.nn.Linear, rows: int) -> None:
        torch.nn.Module.__init__(self)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.register_parameter("bias", linear.bias)
        self.rows = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return row_tiled(self._product, x, self.rows)

    def _product(self, tile: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(tile, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rows={self.rows}"


class PackedProduct(torch.nn.Module):
    """``x W^T + b`` with ``W`` packed once: in our bfloat16 kernel's layout where ``bf16`` is given
    and takes the weight, else in oneDNN's blocked one. One layout only: the weight is held once."""

    packed_weight: torch.Tensor | None  # buffers, typed for the product's signature
    bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bf16: Bf16Gemm | None) -> None:
        super().__init__()
        self.dtype = weight.dtype
        self.own: PackedBf16 | None = bf16.pack(weight, bias) if bf16 is not None and bf16.takes(weight) else None
        packed = torch.ops.mkldnn._reorder_linear_weight(weight) if self.own is None else None
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.row_tile = 0  # > 0: oneDNN products of exactly this many rows (``row_tiled``)

    @property
    def rows_independent(self) -> bool:
        """Whether a row's result never depends on the rows beside it (no row tiles needed)."""
        return self.own is not None

    def apply_unchecked(self, x: torch.Tensor) -> torch.Tensor:
        """The product without module dispatch or a dtype check (for callers that know the dtype)."""
        if self.own is not None:
            return self.own.product(x)
        assert self.packed_weight is not None  # set whenever ``own`` is not (an invariant, not input)
        return packed_product(x, self.packed_weight, self.bias, self.row_tile)
