"""A faster attention for decode steps on CPU, registered with transformers by name.

Owns ``decode_attention`` and ``use_decode_attention``. A decode step has one query row per
sequence; PyTorch's CPU ``scaled_dot_product_attention`` handles that shape poorly (about 3x slower
than two grouped matmuls on the 2-core test machine, measured per 30 layers at batch 16). For one
query row we compute attention directly, grouping the query heads that share a KV head instead of
copying the KV heads (`repeat_kv`); every other call (prefill, vision towers) goes to transformers'
own SDPA function, so results there are unchanged.

The running batch's cache may be float32 under a bfloat16 model (kv_cache.py): PyTorch's CPU
bfloat16 batched matmul copies a strided cache view before every product and builds a new oneDNN
primitive for each new length, while float32 goes to MKL's strided batched GEMM with neither
(2-5x faster per layer at batch 1-16). The query is widened to the cache's dtype and the result
narrowed back to the model's.

Where the C kernel of ``native/attention_kernel.py`` could be built, a bfloat16 cache stays
bfloat16 and one-row steps go to that kernel instead, which reads the cache in place; so do
float32 caches (a float32 model's).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from python_backend.cpu.native.attention_kernel import DecodeAttentionKernel

NAME = "triton_chat_decode"


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    kernel: DecodeAttentionKernel | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for ``query`` [B, H, q, D] over ``key``/``value`` [B, KV, L, D]; returns [B, q, H, D]."""
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or heads % kv_heads or kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        if key.dtype != query.dtype:
            key, value = key.to(query.dtype), value.to(query.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    scale = scaling if scaling is not None else dim**-0.5
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        return grouped_matmul_attention(query, key, value, attention_mask, scale)  # an additive mask
    keep = attention_mask[:, 0, -1, : key.shape[-2]] if attention_mask is not None else None
    return one_row_attention(query, key, value, keep, scale, kernel), None


def one_row_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    keep: torch.Tensor | None,
    scale: float,
    kernel: DecodeAttentionKernel | None,
) -> torch.Tensor:
    """[B, 1, H, D] attention of one query row per sequence; ``keep`` [B, L] marks real positions.

    The C kernel where it handles these tensors (a bfloat16 or float32 cache), else grouped matmuls.
    """
    if kernel is not None and kernel.handles(query, key, value):
        return kernel.attend(query, key, value, keep, scale)
    mask = keep[:, None, None, :] if keep is not None else None
    return grouped_matmul_attention(query, key, value, mask, scale)[0]


def grouped_matmul_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, None]:
    """One query row per sequence by two grouped matmuls; ``attention_mask`` [B, 1, q, L] or None."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    # The wider dtype of the two: a float32 cache under a 16-bit model, or a float32 model's query
    # over a bfloat16 cache (kv_cache_dtype bfloat16, widened here only without the C kernel).
    wide = torch.promote_types(query.dtype, key.dtype)
    key, value = key.to(wide), value.to(wide)
    grouped = query.reshape(batch, kv_heads, group, dim).to(wide)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale
    if attention_mask is not None:
        # sdpa_mask gives a boolean [B, 1, q, L] (True = attend) or an additive float mask.
        mask = attention_mask[:, :, -1, : key.shape[-2]].reshape(batch, 1, 1, -1)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).to(query.dtype)  # [B, KV, group, D]
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_decode_attention(kernel: DecodeAttentionKernel | None = None) -> str:
    """Register the function (and SDPA's mask format for it) with transformers; returns its name.

    transformers' registry is process-wide; every model loaded here registers the same function,
    with the same kernel (built once per machine), so the last registration wins harmlessly.
    """
    AttentionInterface.register(NAME, partial(decode_attention, kernel=kernel))
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
