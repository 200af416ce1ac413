"""Projections of the same input merged into one prepacked product (q/k/v, and gate/up).

Owns ``FusedProjections`` (the merged oneDNN weight), ``ProjectionSlice`` (what stands in for each
original projection module) and ``fuse_projections``. A decode step at batch 16 spends most of its
time in small matrix products, and each product has a fixed cost (dispatch, a oneDNN primitive, an
OpenMP region whose threads all wait for the slowest). Merging q, k and v into one product and gate
and up into another, as vLLM's merged linear layers do, takes 5 products per layer down to 2; on
the test machine (SmolLM2-135M, bf16, 16 rows) q/k/v fell from 123 to 67 us per layer and gate/up
from 185 to 159 us. The merged product is bit-identical to the separate ones (oneDNN reduces each
output column the same way), which the tests check in float32 and bfloat16.

The model's own forward still calls ``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)`` in turn: the first
call computes the merged product and the next ones take their slice of it, as long as they pass
the very same input tensor (identity, not equality; inference tensors carry no version counter).
Any other call computes afresh, so a mismatch costs time, never correctness. Only the layer
classes whose forward is known to feed one input to all of them are merged (Llama, Qwen2).
"""

from __future__ import annotations

import logging

import torch

from python_backend.cpu.bf16_gemm import Bf16Gemm
from python_backend.cpu.row_tiles import PackedProduct

logger = logging.getLogger(__name__)


def merge_eligible_layer_types() -> tuple[type, ...]:
    """Decoder layers whose attention feeds one input to q/k/v and whose MLP one to gate/up."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    return (LlamaDecoderLayer, Qwen2DecoderLayer)


class FusedProjections(PackedProduct):
    """Several ``nn.Linear`` of one input as one product with a prepacked weight."""

    def __init__(self, linears: list[torch.nn.Linear], bf16: Bf16Gemm | None = None) -> None:
        weight = torch.cat([linear.weight.detach() for linear in linears])
        bias = None
        if any(linear.bias is not None for linear in linears):
            bias = torch.cat(
                [
                    linear.bias.detach() if linear.bias is not None else weight.new_zeros(linear.out_features)
                    for linear in linears
                ]
            )
        super().__init__(weight, bias, bf16)
        self.in_features = linears[0].in_features
        self.widths = [linear.out_features for linear in linears]
        self._starts = [sum(self.widths[:i]) for i in range(len(linears))]
        self._memo: tuple[torch.Tensor, torch.Tensor] | None = None  # (input, merged output)
        self._taken = 0
        # A gate/up pair on our bfloat16 kernel ends its product in silu(gate) * up in one pass.
        two_halves = len(self.widths) == 2 and self.widths[0] == self.widths[1]
        self.ends_in_silu = two_halves and self.own is not None and self.own.ends_in_silu

    def silu_mul_unchecked(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of this gate/up pair's product, without writing the product out: the
        same bits as ``silu.py``'s ``silu_mul`` of ``apply_unchecked(x)``. Only where ``ends_in_silu``."""
        if self.own is None or not self.ends_in_silu:
            raise ValueError("only a gate/up pair of whole tiles on the bfloat16 kernel ends in SiLU")
        return self.own.silu_product(x)

    def split(self, merged: torch.Tensor) -> list[torch.Tensor]:
        return list(merged.split(self.widths, dim=-1))

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Projection ``index`` of ``x``, from the merged product of the same input if there is one."""
        memo = self._memo
        if memo is None or memo[0] is not x:
            memo = (x, self.apply_unchecked(x))
            self._taken = 0
        self._taken += 1
        # Dropped once every part was taken, so neither tensor outlives the layer's forward.
        self._memo = None if self._taken >= len(self.widths) else memo
        start = self._starts[index]
        return memo[1][..., start : start + self.widths[index]]


class ProjectionSlice(torch.nn.Module):
    """Stands in for one projection merged into a ``FusedProjections``."""

    def __init__(self, group: FusedProjections, index: int) -> None:
        super().__init__()
        self.group = group
        self.index = index
        self.in_features = group.in_features
        self.out_features = group.widths[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.group.dtype:
            raise TypeError(f"ProjectionSlice expects {self.group.dtype} input, got {x.dtype}")
        return self.group.part(self.index, x)

    def extra_repr(self) -> str:
        return f"part {self.index} of {len(self.group.widths)}, out_features={self.out_features}"


def _merge(
    owner: torch.nn.Module, names: tuple[str, ...], dtypes: tuple[torch.dtype, ...], bf16: Bf16Gemm | None
) -> int:
    linears = [getattr(owner, name, None) for name in names]
    plain = [m for m in linears if type(m) is torch.nn.Linear]
    if len(plain) != len(names) or len({(m.weight.dtype, m.in_features) for m in plain}) != 1:
        return 0  # a LoRA-wrapped or already replaced projection, or mixed shapes: leave them
    if plain[0].weight.dtype not in dtypes:
        return 0
    group = FusedProjections(plain, bf16)
    for index, name in enumerate(names):
        setattr(owner, name, ProjectionSlice(group, index))
    return len(names)


def fuse_projections(decoder: torch.nn.Module, dtypes: tuple[torch.dtype, ...], bf16: Bf16Gemm | None = None) -> int:
    """Merge q/k/v and gate/up of every eligible layer of ``decoder``; returns how many projections.
    ``bf16``: our bfloat16 kernel, for the merged weights it takes."""
    eligible = merge_eligible_layer_types()
    layers = getattr(decoder, "layers", None) or []
    merged = 0
    for layer in layers:
        if type(layer) not in eligible:
            continue
        merged += _merge(layer.self_attn, ("q_proj", "k_proj", "v_proj"), dtypes, bf16)
        merged += _merge(layer.mlp, ("gate_proj", "up_proj"), dtypes, bf16)
    if merged:
        logger.info("merged %d projections (q/k/v, gate/up) into single products", merged)
    return merged
