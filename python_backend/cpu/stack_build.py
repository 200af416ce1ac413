"""Which decoder layers the one-call decode step (``decode_stack.py``) takes, and their weights as it reads them.

Owns ``build_stack``: a ``DecodeStack`` where every part of every layer of the lean step
(``fast_decode.py``) is a native kernel of ours (the norms, rotary embedding, attention and SiLU
kernels for the model's dtype, and products on our bfloat16 kernel or W8A8 on our int8 kernel),
else None, so that the lean step stays.

May import torch and ``python_backend.cpu`` modules only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

import torch

from python_backend.cpu.bf16_gemm import PackedBf16
from python_backend.cpu.decode_stack import (
    DecodeStack,
    StackEnds,
    StackKernels,
    StackLayer,
    StackProduct,
    StackShape,
)
from python_backend.cpu.fused_norm import FusedRMSNorm
from python_backend.cpu.fused_projections import FusedProjections
from python_backend.cpu.fused_rope import RopeKernel
from python_backend.cpu.native.attention_kernel import DecodeAttentionKernel
from python_backend.cpu.quant_install import QuantFusedProjections
from python_backend.cpu.quant_linear import QuantLinear
from python_backend.cpu.silu import SiluKernel


class StackableLayer(Protocol):
    """A decoder layer's parts as the lean step holds them (``fast_decode.py``'s ``_Layer``)."""

    @property
    def input_norm(self) -> torch.nn.Module: ...

    @property
    def qkv(self) -> FusedProjections: ...

    @property
    def o(self) -> torch.nn.Module: ...

    @property
    def post_norm(self) -> torch.nn.Module: ...

    @property
    def gate_up(self) -> FusedProjections: ...

    @property
    def down(self) -> torch.nn.Module: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def scaling(self) -> float: ...

    @property
    def query_heads(self) -> int: ...


def build_stack(
    config: Any,
    layers: Sequence[StackableLayer],
    kernel: DecodeAttentionKernel | None,
    rope: RopeKernel | None,
    silu: SiluKernel | None,
    decoder: torch.nn.Module | None = None,
    head: torch.nn.Module | None = None,
) -> DecodeStack | None:
    """The one-call layers where every part of every layer is a native kernel of ours, else None.
    With the ``decoder``'s input embedding and final norm and the output ``head`` in forms it
    takes too (``_stack_ends``), the stack also runs whole steps."""
    if kernel is None or rope is None or silu is None or not layers:
        return None
    modules = [n for layer in layers for n in (layer.input_norm, layer.post_norm)]
    norms = [n for n in modules if isinstance(n, FusedRMSNorm) and type(n) is FusedRMSNorm]
    if len(norms) != len(modules) or len({n.kernel for n in norms}) != 1:
        return None
    first = layers[0]
    dtype = norms[0].weight.dtype
    if dtype not in silu.dtypes or any(n.weight.dtype != dtype for n in norms):
        return None
    heads, dim = first.query_heads, first.head_dim
    kv_heads = first.qkv.widths[1] // dim
    shape = StackShape(dtype, int(config.hidden_size), heads, kv_heads, dim, first.gate_up.widths[0])
    stacked = []
    for layer in layers:
        qkv, o, gate_up, down = (
            _stack_product(_product_of(m), dtype) for m in (layer.qkv, layer.o, layer.gate_up, layer.down)
        )
        if qkv is None or o is None or gate_up is None or down is None:
            return None
        if (
            layer.qkv.widths != [heads * dim, kv_heads * dim, kv_heads * dim]
            or layer.gate_up.widths != [shape.intermediate] * 2
            or layer.head_dim != dim
            or (qkv.in_features, gate_up.in_features) != (shape.hidden, shape.hidden)
            or (o.in_features, o.out_features) != (heads * dim, shape.hidden)
            or (down.in_features, down.out_features) != (shape.intermediate, shape.hidden)
        ):
            return None
        input_norm, post_norm = cast(FusedRMSNorm, layer.input_norm), cast(FusedRMSNorm, layer.post_norm)
        stacked.append(
            StackLayer(
                input_norm.weight.detach(),
                float(input_norm.variance_epsilon),
                qkv,
                o,
                post_norm.weight.detach(),
                float(post_norm.variance_epsilon),
                gate_up,
                down,
                layer.scaling,
            )
        )
    products = [_product_of(m) for layer in layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    ends = _stack_ends(decoder, head, shape, norms[0]) if decoder is not None and head is not None else None
    if ends is not None:
        products.append(_product_of(head))  # type: ignore[arg-type]  # not None where ends are
    gemm = next((p.gemm for p in products if isinstance(p, PackedBf16)), None)
    int8 = next((p.int8_gemm.kernel for p in products if isinstance(p, QuantLinear) and p.int8_gemm is not None), None)
    return DecodeStack.build(stacked, shape, StackKernels(norms[0].kernel, gemm, rope, kernel, silu, int8), ends=ends)


def _stack_ends(
    decoder: torch.nn.Module, head: torch.nn.Module, shape: StackShape, layer_norm: FusedRMSNorm
) -> StackEnds | None:
    """The input embedding, final norm and output head as the stack reads them, where the embedding
    is a plain lookup of the rows' dtype, the norm the layers' kernel and the head one of our
    products; else None (the lean step keeps them)."""
    embedding, norm = getattr(decoder, "embed_tokens", None), getattr(decoder, "norm", None)
    if type(embedding) is not torch.nn.Embedding or embedding.max_norm is not None:
        return None
    table = embedding.weight.detach()
    if table.dtype != shape.dtype or table.dim() != 2 or table.shape[1] != shape.hidden or not table.is_contiguous():
        return None
    if type(norm) is not FusedRMSNorm or norm.kernel is not layer_norm.kernel or norm.weight.dtype != shape.dtype:
        return None
    product = _stack_product(_product_of(head), shape.dtype)
    if product is None or product.in_features != shape.hidden:
        return None
    return StackEnds(table, norm.weight.detach(), float(norm.variance_epsilon), product)


def _product_of(module: torch.nn.Module) -> object:
    """What computes a projection module's product: our bfloat16 kernel's weight, a quantized
    layer, or the module itself (oneDNN's)."""
    own = getattr(module, "own", None)
    if own is not None:
        return own
    if isinstance(module, QuantFusedProjections):
        return module.product
    return module


def _stack_product(product: object, dtype: torch.dtype) -> StackProduct | None:
    """``product`` (a ``PackedBf16``, or a ``QuantLinear`` on our int8 kernel) as the stack calls
    it on rows of ``dtype``; None for any other product."""
    if isinstance(product, PackedBf16) and dtype == torch.bfloat16:
        packed, bias = product.addresses
        return StackProduct(packed, bias, product.in_features, product.out_features, (product.packed, product.bias))
    if isinstance(product, QuantLinear) and product.int8_gemm is not None and product.dtype == dtype:
        weight = product.int8_gemm.weight
        packed, compensation = weight.addresses
        scales = cast(torch.Tensor, product.weight_scale)
        wide_bias = cast(torch.Tensor | None, product.bias_f32)
        return StackProduct(
            packed,
            wide_bias.data_ptr() if wide_bias is not None else None,
            product.in_features,
            product.out_features,
            (weight.packed, weight.compensation, scales, wide_bias),
            compensation,
            scales.data_ptr(),
            product.static_input_scale or 0.0,
        )
    return None
