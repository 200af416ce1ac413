"""Quantized layers put in place of a model's linear layers.

Owns ``install_quantized`` (a ``QuantLinear`` for each quantized layer, q/k/v and gate/up of a
Llama or Qwen2 layer merged into one product, as ``fused_projections.py`` does for prepacked
bfloat16 weights) and ``QuantFusedProjections`` (such a merged product, which the model's forward
reads through ``ProjectionSlice`` and the lean decode step calls whole).

May import torch and ``python_backend.cpu`` modules only.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from python_backend.cpu.fused_projections import FusedProjections, ProjectionSlice, merge_eligible_layer_types
from python_backend.cpu.int8_gemm import Int8Gemm
from python_backend.cpu.quant_linear import Int8Paths, QuantLinear, QuantWeight, choose_kernel, concat_weights

logger = logging.getLogger(__name__)


class QuantFusedProjections(FusedProjections):
    """Quantized projections of one input as one ``QuantLinear`` (q/k/v, gate/up)."""

    def __init__(self, widths: list[int], merged: QuantLinear) -> None:
        torch.nn.Module.__init__(self)
        self.dtype = merged.dtype
        self.in_features = merged.in_features
        self.widths = widths
        self._starts = [sum(widths[:i]) for i in range(len(widths))]
        self.product = merged
        self.bias = None
        self._memo = None
        self._taken = 0
        self.own = None  # the product is ``merged``'s, not our bfloat16 kernel's
        # A gate/up pair on our int8 kernel (its AVX-512 build) ends its product in silu(gate) * up in one pass.
        self.ends_in_silu = len(widths) == 2 and widths[0] == widths[1] and merged.ends_in_silu
        self.row_tile = 0

    def apply_unchecked(self, x: torch.Tensor) -> torch.Tensor:
        return self.product.apply_unchecked(x)

    def silu_mul_unchecked(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ends_in_silu:
            raise ValueError("only a gate/up pair of whole tiles on the AVX-512 int8 kernel ends in SiLU")
        return self.product.silu_product_unchecked(x)


def _install_merged(
    owner: torch.nn.Module,
    names: tuple[str, ...],
    parts: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device,
    int8: Int8Paths | None,
) -> bool:
    """``owner``'s projections ``names`` as one quantized product; False where they cannot merge."""
    if not all(name in parts for name in names):
        return False
    weights = [parts[name][0] for name in names]
    merged = concat_weights(weights)
    native = int8 is not None and int8.gemm is not None and Int8Gemm.handles_dtype(dtype)
    if merged is None or len({choose_kernel(w, device, native, dtype) for w in weights}) != 1:
        return False
    biases = [parts[name][1] for name in names]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [
                b.detach().float() if b is not None else torch.zeros(w.out_features)
                for b, w in zip(biases, weights, strict=True)
            ]
        )
    group = QuantFusedProjections([w.out_features for w in weights], QuantLinear(merged, bias, dtype, device, int8))
    for index, name in enumerate(names):
        setattr(owner, name, ProjectionSlice(group, index))
    return True


def install_quantized(
    decoder: torch.nn.Module,
    parts: dict[str, tuple[QuantWeight, torch.Tensor | None]],
    dtype: torch.dtype,
    device: torch.device,
    int8: Int8Paths | None = None,
) -> int:
    """Put a ``QuantLinear`` in place of each module of ``decoder`` named in ``parts`` (name: weight,
    bias); q/k/v and gate/up of Llama and Qwen2 layers become one merged product each. Returns how
    many projections were merged. ``int8``: the C paths of W8A8 products on CPU."""
    eligible = merge_eligible_layer_types()
    done: set[str] = set()
    merged = 0
    for index, layer in enumerate(getattr(decoder, "layers", None) or []):
        if type(layer) not in eligible:
            continue
        for owner, prefix, names in (
            (layer.self_attn, f"layers.{index}.self_attn.", ("q_proj", "k_proj", "v_proj")),
            (layer.mlp, f"layers.{index}.mlp.", ("gate_proj", "up_proj")),
        ):
            local = {name: parts[prefix + name] for name in names if prefix + name in parts}
            if _install_merged(owner, names, local, dtype, device, int8):
                done.update(prefix + name for name in names)
                merged += len(names)
    for name, (weight, bias) in parts.items():
        if name in done:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = decoder.get_submodule(parent_name) if parent_name else decoder
        setattr(parent, child, QuantLinear(weight, bias, dtype, device, int8))
    if merged:
        logger.info("merged %d quantized projections (q/k/v, gate/up) into single products", merged)
    return merged
