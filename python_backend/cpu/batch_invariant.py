"""The batch-invariant mode: greedy output that does not depend on the batch or the prefix cache.

Owns ``install_batch_invariant`` (what the loader calls), ``invariant_attention`` (the attention
function registered with transformers for prefill and decode alike) and ``InvariantAttend`` (the
same for the lean decode step). Without the mode, a sequence's logits change in the last bits
with its company: the matrix products pick their kernel (and so the order of each row's sum) by
row count, and prefill attention (SDPA over every query) sums in another order than decode
attention of one query, so at temperature 0 a prompt can answer differently alone, in a batch,
or when its prefix comes from the prefix cache. In the mode:

- every linear layer of the decoder and the output projection computes products of exactly
  ``ROW_TILE`` rows (``row_tiles.py``), prepacked or not;
- attention is one C kernel for prefill and decode (``native/invariant_attention.c``) whose
  reduction for a query runs over that query's visible keys in ascending order;
- rotary embeddings come from a table computed in fixed blocks of positions (``rotary_table.py``),
  whose values do not depend on the batch's shape;
- the rest is per row already: embedding lookups, RMSNorm (a row's mean over its own features),
  the MLP's activation (element-wise over rows whose width is a multiple of the vector width),
  greedy sampling (an argmax per row).

The running batch then keeps the model's dtype (no float32 widening of a bfloat16 cache), and
the decode-attention kernel of ``native/attention_kernel.py`` is not used.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from python_backend.cpu.native.invariant_attention import InvariantAttentionKernel
from python_backend.cpu.rotary_table import TabulatedRotary, tabulable
from python_backend.cpu.row_tiles import PackedProduct, TiledLinear

logger = logging.getLogger(__name__)

NAME = "triton_chat_batch_invariant"
# Rows per matrix product: one AMX tile, and little padding at decode batches up to 16.
ROW_TILE = 16


class UnsupportedAttention(TypeError):
    """A model asked for an attention variant the batch-invariant kernel does not compute."""


def invariant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    kernel: InvariantAttentionKernel | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query`` [B, H, q, D] over ``key``/``value`` [B, KV, L, D]
    with sdpa's boolean mask [B, 1, q, >= L] or None (causal); returns [B, q, H, D]."""
    if kernel is None:
        raise UnsupportedAttention("invariant_attention needs its kernel (use_invariant_attention)")
    for name in ("softcap", "s_aux", "sliding_window"):
        if kwargs.get(name) is not None:
            raise UnsupportedAttention(f"batch-invariant attention does not compute {name}")
    mask = None
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            raise UnsupportedAttention("batch-invariant attention takes boolean masks only")
        batch, _, queries, _ = query.shape
        mask = attention_mask[:, 0, :, : key.shape[-2]].expand(batch, queries, key.shape[-2])
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return kernel.attend(query, key, value, mask, scale), None


class InvariantAttend:
    """The lean decode step's attention (``FastDecoder``): one query row per sequence, same kernel."""

    def __init__(self, kernel: InvariantAttentionKernel) -> None:
        self._kernel = kernel

    def __call__(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor | None, scale: float
    ) -> torch.Tensor:
        """``query`` [B, H, 1, D]; ``keep`` [B, L] marks real positions; returns [B, 1, H, D]."""
        return self._kernel.attend(query, key, value, keep[:, None, :] if keep is not None else None, scale)


def use_invariant_attention(kernel: InvariantAttentionKernel) -> str:
    """Register ``invariant_attention`` (and SDPA's boolean masks for it) with transformers.

    The registry is process-wide; every model loaded with the mode registers the same function
    with a kernel built from the same source, so the last registration wins harmlessly.
    """
    AttentionInterface.register(NAME, partial(invariant_attention, kernel=kernel))
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def _inside(name: str, roots: list[str]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def install_batch_invariant(
    model: torch.nn.Module, decoder: torch.nn.Module, head: torch.nn.Module | None, rows: int = ROW_TILE
) -> int:
    """Make every linear product of ``decoder`` and ``head`` (inside ``model``) run ``rows`` rows at a
    time; returns how many products. Call it after ``pack_linears`` (if at all)."""
    targets = {id(decoder), id(head)} if head is not None else {id(decoder)}
    roots = [name for name, module in model.named_modules() if id(module) in targets]
    tiled = 0
    for name, module in list(model.named_modules()):
        if not _inside(name, roots):
            continue
        if isinstance(module, PackedProduct):
            if not module.rows_independent:  # our bfloat16 kernel's rows are invariant already
                module.row_tile = rows
                tiled += 1
        elif type(module) is torch.nn.Linear:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, TiledLinear(module, rows))
            tiled += 1
    rotary = getattr(decoder, "rotary_emb", None)
    if isinstance(rotary, torch.nn.Module):
        if not tabulable(rotary):
            logger.warning("batch-invariant mode: this model's length-dependent rotary embedding is not tabulated")
        elif not isinstance(rotary, TabulatedRotary):
            decoder.rotary_emb = TabulatedRotary(rotary)
    logger.info("batch-invariant mode: %d linear products run %d rows at a time", tiled, rows)
    return tiled
