"""A lean decode step for Llama and Qwen2 text models on CPU.

Owns ``FastDecoder``. A decode step through transformers' modules spends about 5 ms per step of
SmolLM2-135M (30 layers, 12 % of the step at batch 16) in module dispatch, keyword plumbing, mask
construction and per-layer wrappers that a one-token step does not need. This module runs the
same operations in the same order on the model's own submodules and weights: the embedding, the
rotary embedding module (so every rope scaling the model supports is kept), the RMSNorm modules,
the prepacked projections (``cpu/linear.py``), the running batch's cache and the decode attention
(``attention.py``, or the C kernel). Its logits are bit-identical to the stock forward pass, which
the tests check in float32 and bfloat16.

It is used only where that equality is known to hold: exactly the ``LlamaDecoderLayer`` or
``Qwen2DecoderLayer`` classes, full attention in every layer (no sliding window), SiLU MLPs, every
projection prepacked and merged, and no LoRA adapters (the engine falls back to the model's own forward).
Prefill always goes through the model's own forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from transformers.models.llama.modeling_llama import rotate_half

from python_backend.cpu.attention import one_row_attention
from python_backend.cpu.fused_projections import FusedProjections, ProjectionSlice, merge_eligible_layer_types
from python_backend.cpu.linear import PackedLinear
from python_backend.cpu.native.attention_kernel import DecodeAttentionKernel
from python_backend.engine.kv_cache import BatchCache

# (query [B, H, 1, D], keys, values [B, KV, L, D], keep [B, L] or None, scale) -> [B, 1, H, D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float], torch.Tensor]


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.nn.Module
    qkv: FusedProjections
    o: PackedLinear
    post_norm: torch.nn.Module
    gate_up: FusedProjections
    down: PackedLinear
    head_dim: int
    scaling: float

    @property
    def qk_width(self) -> int:
        return self.qkv.widths[0] + self.qkv.widths[1]

    @property
    def query_heads(self) -> int:
        return self.qkv.widths[0] // self.head_dim


def _merged(projections: tuple[Any, ...]) -> FusedProjections | None:
    """The group these projections were merged into, in this order, or None."""
    if not all(type(p) is ProjectionSlice for p in projections):
        return None
    group = projections[0].group
    if len(group.widths) != len(projections) or any(
        p.group is not group or p.index != i for i, p in enumerate(projections)
    ):
        return None
    return group  # type: ignore[no-any-return]


class FastDecoder:
    """``logits(input_ids, position_ids, cache, keep)`` for one new token per running sequence."""

    def __init__(self, decoder: Any, head: torch.nn.Module, layers: list[_Layer], attend: Attend):
        self._decoder = decoder
        self._head = head
        self._layers = layers
        self._attend = attend

    @staticmethod
    def build(model: Any, kernel: DecodeAttentionKernel | None, attend: Attend | None = None) -> FastDecoder | None:
        """The lean step for ``model`` (a transformers causal LM), or None where it would not be exact.

        ``attend``: the attention the model's forward uses for one query row, when it is not the
        decode attention of ``attention.py`` with ``kernel`` (the batch-invariant mode's).
        """
        decoder = model.get_decoder()
        head = model.get_output_embeddings()
        config = decoder.config
        layer_types = getattr(config, "layer_types", None) or []
        if getattr(config, "hidden_act", None) != "silu" or any(t != "full_attention" for t in layer_types):
            return None
        if not all(hasattr(decoder, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm")):
            return None
        if head is None:
            return None
        eligible = merge_eligible_layer_types()
        layers = []
        for layer in decoder.layers:
            if type(layer) not in eligible:
                return None
            attention, mlp = layer.self_attn, layer.mlp
            qkv = _merged((attention.q_proj, attention.k_proj, attention.v_proj))
            gate_up = _merged((mlp.gate_proj, mlp.up_proj))
            if qkv is None or gate_up is None:
                return None
            if not (type(attention.o_proj) is PackedLinear and type(mlp.down_proj) is PackedLinear):
                return None
            if getattr(attention, "sliding_window", None) is not None:
                return None
            layers.append(
                _Layer(
                    layer.input_layernorm,
                    qkv,
                    attention.o_proj,
                    layer.post_attention_layernorm,
                    gate_up,
                    mlp.down_proj,
                    head_dim=int(attention.head_dim),
                    scaling=float(attention.scaling),
                )  # fmt: skip
            )
        return FastDecoder(decoder, head, layers, attend or partial(one_row_attention, kernel=kernel))

    def logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: BatchCache, keep: torch.Tensor | None
    ) -> torch.Tensor:
        """[B, vocab] logits of the next token; ``keep`` [B, L + 1] marks real (non-padding) positions."""
        batch = input_ids.shape[0]
        hidden = self._decoder.embed_tokens(input_ids)  # [B, 1, H]
        cos, sin = self._decoder.rotary_emb(hidden, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for index, layer in enumerate(self._layers):
            residual = hidden
            x = layer.input_norm(hidden)
            merged = layer.qkv.apply_unchecked(x)
            # Queries and keys rotate together: the rotation is element-wise per head, so one
            # pass over both heads' columns gives exactly the two separate results, in half the ops.
            query_key = merged[..., : layer.qk_width].view(batch, 1, -1, layer.head_dim).transpose(1, 2)
            value = merged[..., layer.qk_width :].view(batch, 1, -1, layer.head_dim).transpose(1, 2)
            query_key = (query_key * cos) + (rotate_half(query_key) * sin)
            query, key = query_key[:, : layer.query_heads], query_key[:, layer.query_heads :]
            keys, values = cache.update(key, value, index)
            attended = self._attend(query, keys, values, keep, layer.scaling)
            hidden = residual + layer.o.apply_unchecked(attended.reshape(batch, 1, -1).contiguous())
            residual = hidden
            x = layer.post_norm(hidden)
            gate, up = layer.gate_up.split(layer.gate_up.apply_unchecked(x))
            gated = torch.nn.functional.silu(gate) * up
            hidden = residual + layer.down.apply_unchecked(gated)
        hidden = self._decoder.norm(hidden)
        return self._head(hidden)[:, -1, :]
