"""A lean decode step for Llama and Qwen2 text models on CPU.

Owns ``FastDecoder``. A decode step through transformers' modules spends about 5 ms per step of
SmolLM2-135M (30 layers, 12 % of the step at batch 16) in module dispatch, keyword plumbing, mask
construction and per-layer wrappers that a one-token step does not need. This module runs the
same operations in the same order on the model's own submodules and weights: the embedding, the
rotary embedding module (so every rope scaling the model supports is kept), the RMSNorm modules
(``fused_norm.py``'s kernel, which also takes the residual add before each norm), the prepacked
projections (``cpu/linear.py``), the running batch's cache and the decode attention
(``attention.py``, or the C kernel). Its logits are bit-identical to the model's own forward pass
(whose norms are the same modules), which the tests check in float32 and bfloat16.

It is used only where that equality is known to hold: exactly the ``LlamaDecoderLayer`` or
``Qwen2DecoderLayer`` classes, full attention in every layer (no sliding window), SiLU MLPs, every
projection prepacked (or quantized: ``quant_linear.py``) and merged, and no LoRA adapters (the engine falls back to the model's own forward).

Where every part of every layer is a native kernel of ours (bfloat16 products on CPUs with
AVX512-BF16, W8A8 ones on our int8 kernel with bfloat16 or float32 rows), a step without prompt
tokens runs all the layers in one call (``decode_stack.py``): the same kernels in the same order,
bit for bit the loop's results, without its per-layer Python; where the embedding, the final
norm and the output head are ours as well, that call is the whole step, from token ids to logits.

``mixed_logits`` is the same step with prompt tokens beside the decode rows, as vLLM's chunked
prefill mixes them: every projection, norm and MLP runs once over all the step's tokens (the
weights are read once, not once for the prefill and again for the decode), and only attention
is split, each prompt segment attending causally to its own cache. A decode step then never
waits behind a separate prefill pass. With prompt tokens its decode logits equal the model's
within rounding (the products see more rows), not bitwise; ``logits`` is the same pass without
them, bit-identical to the model's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar, cast

import torch
from transformers.cache_utils import Cache
from transformers.models.llama.modeling_llama import rotate_half

from python_backend.cpu.attention import one_row_attention
from python_backend.cpu.decode_stack import CacheLayer, DecodeStack
from python_backend.cpu.fused_norm import FusedRMSNorm
from python_backend.cpu.fused_projections import FusedProjections, ProjectionSlice, merge_eligible_layer_types
from python_backend.cpu.fused_rope import RopeKernel
from python_backend.cpu.linear import PackedLinear
from python_backend.cpu.native.attention_kernel import DecodeAttentionKernel
from python_backend.cpu.prompt_attention import PromptAttentionKernel
from python_backend.cpu.quant_linear import QuantLinear
from python_backend.cpu.rotary_table import TabulatedRotary, tabulable
from python_backend.cpu.silu import NativeSiLU, SiluKernel
from python_backend.cpu.stack_build import build_stack

# (query [B, H, 1, D], keys, values [B, KV, L, D], keep [B, L] or None, scale) -> [B, 1, H, D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float], torch.Tensor]

# The step's caches: any transformers cache (the step only calls ``update(key, value, layer)``);
# the engine's own kind (engine/batch_cache.py) stays its type in the rows and segments it builds.
# The products a layer's o/down projection may be: the same modules the model's forward calls.
_PRODUCTS = (PackedLinear, QuantLinear)
CacheT = TypeVar("CacheT", bound=Cache)


@dataclass
class DecodeRows(Generic[CacheT]):
    """The running batch's part of a step: one new token per row."""

    input_ids: torch.Tensor  # [B, 1]
    position_ids: torch.Tensor  # [B, 1]
    cache: CacheT
    keep: torch.Tensor | None  # [B, L + 1], True on real positions; None without padding


@dataclass
class PromptSegment(Generic[CacheT]):
    """Prompt tokens of one request computed in a mixed step, after the positions its one-row
    ``cache`` already holds (a cached prefix, earlier chunks); the cache is extended in place."""

    input_ids: list[int]
    start: int  # the position of the first
    cache: CacheT
    want_logits: bool  # the prompt ends here: the logits of its last position are needed


@dataclass
class MixedLogits:
    decode: torch.Tensor | None  # [B, vocab], None without decode rows
    segments: list[torch.Tensor | None]  # [1, vocab] per segment that wanted logits, else None


def causal_rows(count: int, total: int) -> torch.Tensor:
    """[count, total] uint8: row t sees positions up to its own, ``total - count + t``."""
    return torch.ones(count, total, dtype=torch.uint8).tril_(total - count)


def prompt_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    kernel: DecodeAttentionKernel | None = None,
    visible: torch.Tensor | None = None,
    tiles: PromptAttentionKernel | None = None,
) -> torch.Tensor:
    """Causal attention of ``query`` [1, H, T, D], the last T of ``key``/``value`` [1, KV, P + T, D]'s
    positions; returns [T, H * D].

    With ``kernel`` and ``visible`` (``causal_rows(T, P + T)``), each query row is one row of the
    decode-attention kernel over the segment's keys and values, shared at a batch stride of 0, its
    mask ending at its own position: the kernel skips the masked tail, reads the segment's keys
    from cache for every row, and neither copies the KV heads per query head nor builds a mask per
    layer, where PyTorch's CPU SDPA was 2x slower at 300-500 positions. ``tiles``
    (``prompt_attention.py``), where it takes these tensors, is faster still (1.4-1.9x the decode
    kernel's rows, docs/performance.md).
    """
    if tiles is not None and tiles.handles(query, key, value):
        return tiles.attend(query, key, value, scale)
    heads, count = query.shape[1], query.shape[2]
    if kernel is not None and visible is not None:
        rows = query[0].transpose(0, 1).unsqueeze(2)  # [T, H, 1, D]
        shared = (count, -1, -1, -1)
        if kernel.handles(rows, key.expand(shared), value.expand(shared)):
            return kernel.attend(rows, key.expand(shared), value.expand(shared), visible, scale).view(count, -1)
    past = key.shape[2] - count
    groups = heads // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if key.dtype != query.dtype:
        key, value = key.to(query.dtype), value.to(query.dtype)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if past == 0:
        out = sdpa(query, key, value, is_causal=True, scale=scale)
    else:
        visible = torch.arange(past + count, device=query.device)[None, :] <= (
            past + torch.arange(count, device=query.device)[:, None]
        )
        out = sdpa(query, key, value, attn_mask=visible, scale=scale)
    return out[0].transpose(0, 1).reshape(count, -1)


def _add_norm(
    norm: torch.nn.Module, hidden: torch.Tensor, delta: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``norm(hidden + delta)``, ``hidden + delta``): the residual add and the norm after it, in
    one pass where the norm is the kernel's (the sum rounds as PyTorch's add rounds it)."""
    if delta is None:
        return norm(hidden), hidden
    if type(norm) is FusedRMSNorm:
        return norm.add_norm(hidden, delta)
    summed = hidden + delta
    return norm(summed), summed


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.nn.Module
    qkv: FusedProjections
    o: PackedLinear | QuantLinear
    post_norm: torch.nn.Module
    gate_up: FusedProjections
    down: PackedLinear | QuantLinear
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

    def __init__(
        self,
        decoder: Any,
        head: torch.nn.Module,
        layers: list[_Layer],
        attend: Attend,
        mixes: bool = True,
        rope: RopeKernel | None = None,
        prompt_kernel: DecodeAttentionKernel | None = None,
        prompt_tiles: PromptAttentionKernel | None = None,
        silu: SiluKernel | None = None,
        stack: DecodeStack | None = None,
    ):
        self._decoder = decoder
        self._head = head
        self._layers = layers
        self._attend = attend
        self._rope = rope  # the one-pass rotary embedding (fused_rope.py), or None: PyTorch's
        # Prompt segments attend through prompt_attention: not with a model whose attention must
        # stay its own (the batch-invariant mode's one kernel for prefill and decode).
        self.mixes = mixes
        # prompt_attention's kernels: the tiled one, else the decode kernel's rows, else SDPA.
        self._prompt_kernel = prompt_kernel
        self._prompt_tiles = prompt_tiles
        self._silu = silu  # silu(gate) * up in one pass: only where the model's MLPs run the same SiLU
        self.stack = stack  # pure decode steps' layers in one native call (decode_stack.py), or None
        # The rotary embedding's rows from a table of the module's own results (rotary_table.py),
        # where they depend on the position alone; else the module, called every step.
        rotary = decoder.rotary_emb
        self._table = TabulatedRotary(rotary) if tabulable(rotary) else None
        self._rotary = self._table.forward if self._table is not None else rotary

    @staticmethod
    def build(
        model: Any,
        kernel: DecodeAttentionKernel | None,
        attend: Attend | None = None,
        rope: RopeKernel | None = None,
        prompt: PromptAttentionKernel | None = None,
        silu: SiluKernel | None = None,
    ) -> FastDecoder | None:
        """The lean step for ``model`` (a transformers causal LM), or None where it would not be exact.

        ``attend``: the attention the model's forward uses for one query row, when it is not the
        decode attention of ``attention.py`` with ``kernel`` (the batch-invariant mode's).
        ``silu``: the kernel the model's MLPs were given (``silu.fuse_silu``), if they were.
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
        if silu is not None and not all(type(layer.mlp.act_fn) is NativeSiLU for layer in decoder.layers):
            silu = None  # the step's SiLU must be the model's own
        for layer in decoder.layers:
            if type(layer) not in eligible:
                return None
            attention, mlp = layer.self_attn, layer.mlp
            qkv = _merged((attention.q_proj, attention.k_proj, attention.v_proj))
            gate_up = _merged((mlp.gate_proj, mlp.up_proj))
            if qkv is None or gate_up is None:
                return None
            if not (type(attention.o_proj) in _PRODUCTS and type(mlp.down_proj) in _PRODUCTS):
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
        attend_one = attend or partial(one_row_attention, kernel=kernel)
        own = attend is None  # the batch-invariant mode's attention covers prompts too
        stack = build_stack(config, layers, kernel, rope, silu, decoder, head) if own else None
        return FastDecoder(
            decoder, head, layers, attend_one, own, rope, kernel if own else None, prompt if own else None, silu, stack
        )

    @property
    def rotates_natively(self) -> bool:
        """Whether queries and keys are rotated by the C kernel (``fused_rope.py``)."""
        return self._rope is not None

    def _rotate(self, query_key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self._rope is not None and self._rope.handles(query_key, cos, sin):
            return self._rope.rotate(query_key, cos, sin)
        return (query_key * cos) + (rotate_half(query_key) * sin)

    def logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: Cache, keep: torch.Tensor | None
    ) -> torch.Tensor:
        """[B, vocab] logits of the next token; ``keep`` [B, L + 1] marks real (non-padding) positions."""
        out = self.mixed_logits(DecodeRows(input_ids, position_ids, cache, keep), [])
        assert out.decode is not None  # decode rows were given (an invariant, not input)
        return out.decode

    def mixed_logits(self, decode: DecodeRows[CacheT] | None, segments: list[PromptSegment[CacheT]]) -> MixedLogits:
        """One forward pass over the decode rows' new tokens and the prompt segments' tokens."""
        stack = self.stack
        if stack is not None and stack.ends is not None and decode is not None and not segments:
            whole = self._whole_step(stack, stack.ends.embedding, decode)
            if whole is not None:
                return MixedLogits(whole, [])
        rows = decode.input_ids.shape[0] if decode is not None else 0
        device = self._decoder.embed_tokens.weight.device
        ids = [decode.input_ids.view(-1)] if decode is not None else []
        positions = [decode.position_ids.view(-1)] if decode is not None else []
        for segment in segments:
            ids.append(torch.tensor(segment.input_ids, dtype=torch.long, device=device))
            positions.append(torch.arange(segment.start, segment.start + len(segment.input_ids), device=device))
        if len(ids) == 1:  # one part: no copy
            input_ids, position_ids = ids[0].view(1, -1), positions[0].view(1, -1)
        else:
            input_ids, position_ids = torch.cat(ids).unsqueeze(0), torch.cat(positions).unsqueeze(0)
        hidden = self._decoder.embed_tokens(input_ids)  # [1, N, H]: every token of the step
        cos, sin = self._rotary(hidden, position_ids)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [1, N, 1, D]: per token, every head
        pending: torch.Tensor | None  # the last MLP's output, added in the final norm's pass
        if stack is not None and decode is not None and not segments and stack.takes(hidden[0], decode.cache.layers):
            # One native call for every layer, bit for bit the loop's results.
            cache_layers = cast("list[CacheLayer]", decode.cache.layers)  # ``takes`` checked them
            pending = stack.run(hidden[0], cos[0, :, 0], sin[0, :, 0], decode.keep, cache_layers).unsqueeze(0)
        else:
            hidden, pending = self._layer_loop(hidden, cos, sin, decode, segments)
        # Only the rows whose next token is sampled get the last residual add, the norm and the
        # output head.
        picked, ends, offset = list(range(rows)), [], rows
        for segment in segments:
            offset += len(segment.input_ids)
            ends.append(len(picked) if segment.want_logits else None)
            if segment.want_logits:
                picked.append(offset - 1)
        if segments:
            last = pending[:, picked] if pending is not None else None
            normed, _ = _add_norm(self._decoder.norm, hidden[:, picked], last)
        else:  # every row is picked: no gather
            normed, _ = _add_norm(self._decoder.norm, hidden, pending)
        logits = self._head(normed)[0]  # [picked, vocab]
        return MixedLogits(
            logits[:rows] if decode is not None else None,
            [logits[at : at + 1] if at is not None else None for at in ends],
        )

    def _whole_step(
        self, stack: DecodeStack, embedding: torch.Tensor, decode: DecodeRows[CacheT]
    ) -> torch.Tensor | None:
        """The decode rows' logits from one native call (embedding, layers, final norm and head),
        or None where the stack does not take their cache."""
        layers = decode.cache.layers
        if not stack.takes_cache(layers):
            return None
        positions = decode.position_ids.view(-1)
        if self._table is not None:
            last = int(positions[0]) if positions.shape[0] == 1 else int(positions.max())
            tables = self._table.table(embedding, last + 1)  # of the rows' dtype
        else:  # the module's rows for this step's positions, read at 0 to B - 1
            cos, sin = self._rotary(embedding, positions.view(1, -1))
            tables, positions = (cos[0], sin[0]), torch.arange(positions.shape[0])
        caches = cast("list[CacheLayer]", layers)  # ``takes_cache`` checked them
        return stack.run_step(decode.input_ids.view(-1), positions, tables, decode.keep, caches)

    def _layer_loop(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        decode: DecodeRows[CacheT] | None,
        segments: list[PromptSegment[CacheT]],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every decoder layer over ``hidden`` [1, N, H] (the decode rows' tokens, then each segment's),
        one layer at a time: (the residual stream before the last MLP's output, that output; None
        without layers)."""
        rows = decode.input_ids.shape[0] if decode is not None else 0
        count = hidden.shape[1]
        pending: torch.Tensor | None = None  # the last MLP's output, added in the next norm's pass
        # Each segment's causal mask, once for every layer (only the kernel reads it).
        visible = [
            causal_rows(len(s.input_ids), s.start + len(s.input_ids)) if self._prompt_kernel is not None else None
            for s in segments
        ]
        for index, layer in enumerate(self._layers):
            normed, hidden = _add_norm(layer.input_norm, hidden, pending)
            merged = layer.qkv.apply_unchecked(normed)
            query_key = merged[..., : layer.qk_width].view(1, count, -1, layer.head_dim)
            # Queries and keys rotate together: the rotation is element-wise per head, so one
            # pass over both heads' columns gives exactly the two separate results, in half the ops.
            query_key = self._rotate(query_key, cos, sin)  # [1, N, heads, D]
            value = merged[..., layer.qk_width :].view(1, count, -1, layer.head_dim)
            heads = layer.query_heads
            parts = []
            if decode is not None:
                query = query_key[0, :rows, :heads].unsqueeze(2)  # [B, H, 1, D]
                key, row_value = query_key[0, :rows, heads:].unsqueeze(2), value[0, :rows].unsqueeze(2)
                keys, values = decode.cache.update(key, row_value, index)
                parts.append(self._attend(query, keys, values, decode.keep, layer.scaling).reshape(rows, -1))
            offset = rows
            for segment, rows_visible in zip(segments, visible, strict=True):
                end = offset + len(segment.input_ids)
                query = query_key[:, offset:end, :heads].transpose(1, 2)  # [1, H, T, D]
                key, seg_value = query_key[:, offset:end, heads:].transpose(1, 2), value[:, offset:end].transpose(1, 2)
                keys, values = segment.cache.update(key, seg_value, index)
                parts.append(
                    prompt_attention(
                        query, keys, values, layer.scaling, self._prompt_kernel, rows_visible, self._prompt_tiles
                    )
                )
                offset = end
            attended = torch.cat(parts).unsqueeze(0) if len(parts) > 1 else parts[0].unsqueeze(0)
            normed, hidden = _add_norm(layer.post_norm, hidden, layer.o.apply_unchecked(attended))
            if self._silu is not None and layer.gate_up.ends_in_silu:
                activated = layer.gate_up.silu_mul_unchecked(normed)  # the silu_mul below, in the product
            elif self._silu is not None:
                activated = self._silu.silu_mul(layer.gate_up.apply_unchecked(normed))
            else:
                merged = layer.gate_up.apply_unchecked(normed)
                gate, up = layer.gate_up.split(merged)
                activated = torch.nn.functional.silu(gate) * up
            pending = layer.down.apply_unchecked(activated)
        return hidden, pending
