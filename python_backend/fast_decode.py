"""A lean decode step for Llama and Qwen2 text models on CPU.

Owns ``FastDecoder``. A decode step through transformers' modules spends about 5 ms per step of
SmolLM2-135M (30 layers, 12 % of the step at batch 16) in module dispatch, keyword plumbing, mask
construction and per-layer wrappers that a one-token step does not need. This module runs the
same operations in the same order on the model's own submodules and weights: the embedding, the
rotary embedding module (so every rope scaling the model supports is kept), the RMSNorm modules,
the prepacked projections (``cpu_linear.py``), the running batch's cache and the decode attention
(``attention.py``, or the C kernel). Its logits are bit-identical to the stock forward pass, which
the tests check in float32 and bfloat16.

It is used only where that equality is known to hold: exactly the ``LlamaDecoderLayer`` or
``Qwen2DecoderLayer`` classes, full attention in every layer (no sliding window), SiLU MLPs, every
projection prepacked, and no LoRA adapters (the engine falls back to the model's own forward).
Prefill always goes through the model's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.models.llama.modeling_llama import rotate_half

from python_backend.attention import one_row_attention
from python_backend.cpu_linear import PackedLinear
from python_backend.kv_cache import BatchCache
from python_backend.native.attention_kernel import DecodeAttentionKernel


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.nn.Module
    q: PackedLinear
    k: PackedLinear
    v: PackedLinear
    o: PackedLinear
    post_norm: torch.nn.Module
    gate: PackedLinear
    up: PackedLinear
    down: PackedLinear
    head_dim: int
    scaling: float


def _eligible_layer_types() -> tuple[type, ...]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    return (LlamaDecoderLayer, Qwen2DecoderLayer)


class FastDecoder:
    """``logits(input_ids, position_ids, cache, keep)`` for one new token per running sequence."""

    def __init__(self, decoder: Any, head: torch.nn.Module, layers: list[_Layer], kernel: DecodeAttentionKernel | None):
        self._decoder = decoder
        self._head = head
        self._layers = layers
        self._kernel = kernel

    @staticmethod
    def build(model: Any, kernel: DecodeAttentionKernel | None) -> FastDecoder | None:
        """The lean step for ``model`` (a transformers causal LM), or None where it would not be exact."""
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
        eligible = _eligible_layer_types()
        layers = []
        for layer in decoder.layers:
            if type(layer) not in eligible:
                return None
            attention, mlp = layer.self_attn, layer.mlp
            projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                           mlp.gate_proj, mlp.up_proj, mlp.down_proj)  # fmt: skip
            if not all(type(p) is PackedLinear for p in projections):
                return None
            if getattr(attention, "sliding_window", None) is not None:
                return None
            layers.append(
                _Layer(layer.input_layernorm, *projections[:4], layer.post_attention_layernorm, *projections[4:],
                       head_dim=int(attention.head_dim), scaling=float(attention.scaling))  # fmt: skip
            )
        return FastDecoder(decoder, head, layers, kernel)

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
            query = layer.q.apply_unchecked(x).view(batch, 1, -1, layer.head_dim).transpose(1, 2)
            key = layer.k.apply_unchecked(x).view(batch, 1, -1, layer.head_dim).transpose(1, 2)
            value = layer.v.apply_unchecked(x).view(batch, 1, -1, layer.head_dim).transpose(1, 2)
            query = (query * cos) + (rotate_half(query) * sin)
            key = (key * cos) + (rotate_half(key) * sin)
            keys, values = cache.update(key, value, index)
            attended = one_row_attention(query, keys, values, keep, layer.scaling, self._kernel)
            hidden = residual + layer.o.apply_unchecked(attended.reshape(batch, 1, -1).contiguous())
            residual = hidden
            x = layer.post_norm(hidden)
            gated = torch.nn.functional.silu(layer.gate.apply_unchecked(x)) * layer.up.apply_unchecked(x)
            hidden = residual + layer.down.apply_unchecked(gated)
        hidden = self._decoder.norm(hidden)
        return self._head(hidden)[:, -1, :]
