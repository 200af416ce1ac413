"""Linear layers with oneDNN-prepacked weights for CPU inference.

Owns ``PackedLinear``, ``pack_linears`` and ``onednn_has_bfloat16`` (whether the CPU has oneDNN's
bfloat16 kernels, which also decides the CPU's ``auto`` dtype in ``model/device.py``). On CPU,
``torch.nn.functional.linear`` hands oneDNN a plain row-major weight, and oneDNN reorders it into
its blocked layout on every call; for the small row counts of decode (one row per running
sequence) that reorder costs as much as the product.
Reordering each weight once at load time (what vLLM's CPU backend and Inductor's freezing pass also
do) made the linear layers of SmolLM2-135M about 2x faster at batch 1 to 512 on the AVX-512 test
machine (docs/performance.md). Results are bit-identical to the plain call in bfloat16; in
float32 they differ from MKL's in the last bits and, unlike MKL's, do not depend on the row count,
so a sequence's output does not change with the batch it runs in. In bfloat16 it does change
(the kernel depends on the row count) unless ``row_tile`` is set: then every product runs that
many rows at a time (``row_tiles.py``, the batch-invariant mode).

Only the text decoder and the output projection are packed: vision and audio towers, and layers
that LoRA adapters wrap, keep their ``nn.Linear`` (their code reads ``.weight`` directly).
"""

from __future__ import annotations

import logging

import torch

from python_backend.cpu.bf16_gemm import Bf16Gemm
from python_backend.cpu.fused_projections import fuse_projections
from python_backend.cpu.row_tiles import PackedProduct

logger = logging.getLogger(__name__)

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def onednn_has_bfloat16() -> bool:
    """Whether oneDNN has bfloat16 kernels on this CPU: x86 with AVX-512 (BW/VL/DQ; AMX CPUs have
    it) or AVX-NE-CONVERT, Arm with BF16. Without them every bfloat16 product is emulated."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def prepack_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this build of torch, on this CPU, can prepack linear weights for ``device`` and ``dtype``.

    oneDNN's bfloat16 reorder needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT; on an AVX2-only CPU it
    raises at load time, so the answer comes from one tiny reorder and product, not from the build.
    """
    if not (
        device.type == "cpu"
        and dtype in PACKABLE_DTYPES
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return False
    if dtype == torch.bfloat16 and not onednn_has_bfloat16():
        logger.info("oneDNN has no bfloat16 kernels on this CPU: linear weights stay unpacked")
        return False
    try:
        probe = torch.ones(2, 2, dtype=dtype)
        torch.ops.mkldnn._linear_pointwise(probe, torch.ops.mkldnn._reorder_linear_weight(probe), None, "none", [], "")
    except RuntimeError as error:
        logger.info("oneDNN cannot prepack %s weights on this CPU (%s): linear weights stay unpacked", dtype, error)
        return False
    return True


class PackedLinear(PackedProduct):
    """``y = x W^T + b`` with ``W`` held in oneDNN's blocked layout, or in the layout of our own
    bfloat16 kernel (``bf16_gemm.py``) where one is given and takes the weight."""

    def __init__(self, linear: torch.nn.Linear, bf16: Bf16Gemm | None = None) -> None:
        bias = linear.bias.detach() if linear.bias is not None else None
        super().__init__(linear.weight.detach(), bias, bf16)
        self.in_features = linear.in_features
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype:
            # oneDNN does not mix dtypes; nn.Linear would raise here too, only later.
            raise TypeError(f"PackedLinear expects {self.dtype} input, got {x.dtype}")
        return self.apply_unchecked(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}"


def _inside(name: str, roots: list[str]) -> bool:
    """Whether module ``name`` is one of ``roots`` or below one of them."""
    return any(name == root or name.startswith(root + ".") for root in roots)


def pack_linears(
    model: torch.nn.Module, decoder: torch.nn.Module, head: torch.nn.Module | None, bf16: Bf16Gemm | None = None
) -> int:
    """Replace the ``nn.Linear`` layers of ``decoder`` (and ``head``) inside ``model``; returns how many
    (merged projections included). ``bf16``: our bfloat16 kernel, for the layers it takes.

    ``model`` is the module tree to edit (it may be a PEFT wrapper); ``decoder`` and ``head`` are
    found in it by identity, so the wrapper's own naming does not matter.
    """
    # q/k/v and gate/up of the same input become one product each (fused_projections.py).
    merged = fuse_projections(decoder, PACKABLE_DTYPES, bf16)
    targets = {id(decoder), id(head)} if head is not None else {id(decoder)}
    roots = [name for name, module in model.named_modules() if id(module) in targets]
    # PEFT's tuner layers keep the original Linear as ``base_layer`` and read its weight.
    tuners = [name for name, module in model.named_modules() if hasattr(module, "base_layer")]
    replaced = 0
    for name, module in list(model.named_modules()):
        if type(module) is not torch.nn.Linear or module.weight.dtype not in PACKABLE_DTYPES:
            continue
        if not _inside(name, roots) or _inside(name, tuners):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, PackedLinear(module, bf16))
        replaced += 1
    kind = "our bfloat16 kernel where it takes them, else oneDNN" if bf16 is not None else "oneDNN"
    logger.info("prepacked %d linear layers (and %d merged ones) for %s", replaced, merged, kind)
    return replaced + merged
