"""A decode step's decoder layers in one native call, for Llama/Qwen2 models on CPU.

Owns ``DecodeStack``. The lean decode step (``fast_decode.py``) calls a dozen kernels and PyTorch
operations per layer; at a few rows each costs more in Python, ctypes and allocation than in work.
``native/decode_stack.c`` runs the same kernels (their own entry points, taken from the libraries
the lean step loaded) in the same order on buffers allocated once per step, so its results are bit
for bit the lean step's, which the tests check. ``stack_build.py`` builds it only where every
layer's products are our bfloat16 kernel's (``bf16_gemm.py``, bfloat16 models) or W8A8 on our int8
kernel (``int8_gemm.py``, bfloat16 or float32 models: on an AVX2-only CPU, a float32 model's
``--quantization int8``), and the norms, rotary embedding, attention and SiLU are the native
kernels for the model's dtype; anything else keeps the lean step. A float32 model's cache may be
bfloat16 (``--kv-cache-dtype bfloat16``): the stack rounds the new keys and values into it as
PyTorch's copy does, and attention reads it through the kernel's bfloat16-cache entry.
``run_step`` runs the whole step in the same call where the input embedding is a plain lookup and
the final norm and output head are ours too (``StackEnds``): the token ids in, the logits out.

May import torch and ``python_backend.cpu`` modules below it only (not the engine: a cache is
anything whose layers claim positions, ``CacheLayer``).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from python_backend.cpu.bf16_gemm import Bf16Gemm
from python_backend.cpu.fused_norm import NormKernel
from python_backend.cpu.fused_rope import RopeKernel
from python_backend.cpu.int8_gemm import Int8Gemm
from python_backend.cpu.native.attention_kernel import DecodeAttentionKernel
from python_backend.cpu.native.build import load_kernel
from python_backend.cpu.silu import SiluKernel

SOURCE = Path(__file__).with_name("native") / "decode_stack.c"
_I64, _PTR, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
# The caches the stack writes and reads under rows of each dtype (decode_stack.c's ``store``).
_CACHE_DTYPES = {
    torch.bfloat16: (torch.bfloat16,),
    torch.float32: (torch.float32, torch.bfloat16),
}


class _Kernels(ctypes.Structure):
    _fields_ = [
        ("norm", _PTR),
        ("gemm", _PTR),
        ("rope", _PTR),
        ("attend", _PTR),
        ("silu_mul", _PTR),
        ("int8_gemm", _PTR),
        ("gemm_silu", _PTR),
        ("int8_gemm_silu", _PTR),
    ]


class _Product(ctypes.Structure):
    _fields_ = [
        ("packed", _PTR),
        ("bias", _PTR),
        ("compensation", _PTR),
        ("col_scales", _PTR),
        ("static_scale", _F32),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _PTR),
        ("qkv", _Product),
        ("o", _Product),
        ("post_norm", _PTR),
        ("gate_up", _Product),
        ("down", _Product),
        ("keys", _PTR),
        ("values", _PTR),
        ("cache_stride_b", _I64),
        ("cache_stride_h", _I64),
        ("input_eps", _F32),
        ("post_eps", _F32),
        ("scaling", _F32),
    ]


class _Ends(ctypes.Structure):
    _fields_ = [
        ("ids", _PTR),
        ("positions", _PTR),
        ("embedding", _PTR),
        ("embedding_rows", _I64),
        ("cos_table", _PTR),
        ("sin_table", _PTR),
        ("table_rows", _I64),
        ("norm", _PTR),
        ("eps", _F32),
        ("head", _Product),
        ("vocab", _I64),
        ("logits", _PTR),
    ]


class _Shape(ctypes.Structure):
    _fields_ = [(name, _I64) for name in ("batch", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "length")]


class CacheLayer(Protocol):
    """What the stack needs of a cache layer (``engine/batch_cache.py``'s ``GrowableLayer``)."""

    @property
    def storage_dtype(self) -> torch.dtype | None: ...

    @property
    def length(self) -> int: ...

    @property
    def rows(self) -> int: ...

    def append_position(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int]: ...


@dataclass(frozen=True)
class StackProduct:
    """One product as the stack calls it: our bfloat16 kernel's weight, or a W8A8 layer's packed
    int8 weight (``compensation`` given) with its per-channel scales and static input scale."""

    packed: int
    bias: int | None
    in_features: int
    out_features: int
    keep: tuple[torch.Tensor | None, ...]  # the tensors behind the addresses
    compensation: int | None = None
    col_scales: int | None = None
    static_scale: float = 0.0

    @property
    def int8(self) -> bool:
        return self.compensation is not None


@dataclass(frozen=True)
class StackLayer:
    """One decoder layer's weights as the stack reads them."""

    input_norm: torch.Tensor  # [hidden], of the rows' dtype
    input_eps: float
    qkv: StackProduct
    o: StackProduct
    post_norm: torch.Tensor
    post_eps: float
    gate_up: StackProduct
    down: StackProduct
    scaling: float


@dataclass(frozen=True)
class StackEnds:
    """What a whole step adds around the layers: the input embedding [rows, hidden] (a plain
    lookup), and the final norm and output head, all of the rows' dtype."""

    embedding: torch.Tensor
    norm: torch.Tensor  # [hidden]
    eps: float
    head: StackProduct


@dataclass(frozen=True)
class StackShape:
    dtype: torch.dtype  # of the rows and the norms' weights, bfloat16 or float32 (the cache: _CACHE_DTYPES)
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


@dataclass(frozen=True)
class StackKernels:
    """The kernels the stack calls, each by its entry point."""

    norm: NormKernel
    gemm: Bf16Gemm | None  # for bfloat16 products; None where every product is int8 (or rows are float32)
    rope: RopeKernel
    attention: DecodeAttentionKernel
    silu: SiluKernel
    int8: Int8Gemm | None  # for W8A8 layers; None where no product is int8


class DecodeStack:
    """``run(hidden, cos, sin, keep, layers)``: every decoder layer of one decode step in one call."""

    def __init__(
        self,
        library: ctypes.CDLL,
        kernels: StackKernels,
        layers: Sequence[StackLayer],
        shape: StackShape,
        ends: StackEnds | None = None,
    ) -> None:
        self._run = library.triton_chat_decode_stack
        self._run.restype = ctypes.c_int
        self._run.argtypes = [
            _PTR, _PTR, _I64, _PTR, _I64, _I64,  # kernels, layers, count, shape, elem, cache_elem
            _PTR, _PTR, ctypes.c_int, _PTR, _PTR,  # hidden, pending, first_has_pending, cos, sin
            _PTR, _I64, _PTR, _PTR,  # keep, keep_stride, scratch, ends
        ]  # fmt: skip
        self._scratch_size = library.triton_chat_decode_stack_scratch
        self._scratch_size.restype, self._scratch_size.argtypes = _I64, [_PTR]
        dtype = shape.dtype
        bf16 = dtype == torch.bfloat16
        gemm = kernels.gemm if bf16 else None  # our bfloat16 products take bfloat16 rows only
        # One set per cache dtype the stack takes: they differ in the attention's entry only.
        self._kernels = {
            cache: _Kernels(
                kernels.norm.entry(dtype),
                gemm.gemm_address if gemm is not None else None,
                kernels.rope.entry(dtype),
                kernels.attention.entry(dtype, cache),
                kernels.silu.silu_mul_entry(dtype),
                kernels.int8.entry(dtype) if kernels.int8 is not None else None,
                gemm.gemm_silu_address if gemm is not None else None,
                kernels.int8.silu_entry if kernels.int8 is not None and bf16 else None,
            )
            for cache in _CACHE_DTYPES[dtype]
        }
        self._weights = list(layers)  # keeps every tensor the structures point at alive
        self._layers = (_Layer * len(layers))()
        for slot, layer in zip(self._layers, layers, strict=True):
            slot.input_norm, slot.post_norm = layer.input_norm.data_ptr(), layer.post_norm.data_ptr()
            slot.input_eps, slot.post_eps, slot.scaling = layer.input_eps, layer.post_eps, layer.scaling
            for name in ("qkv", "o", "gate_up", "down"):
                product: StackProduct = getattr(layer, name)
                setattr(
                    slot,
                    name,
                    _Product(
                        product.packed, product.bias, product.compensation, product.col_scales, product.static_scale
                    ),
                )
        self.shape = shape
        self._shape = _Shape(0, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate, 0)
        # Per layer, the cache buffers (weakly: a finished batch's buffers are not kept) and window
        # start its slot's addresses were taken from.
        self._windows: list[tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor], int] | None]
        self._windows = [None] * len(layers)
        # A whole step's buffers, kept while the batch keeps its size: (hidden, pending, scratch).
        self._buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._like: torch.Tensor | None = None  # the shape and dtype a cache layer grows to
        self.ends = ends  # keeps the tensors ``_ends`` points at alive
        self._ends: _Ends | None = None
        if ends is not None:
            head = ends.head
            self._ends = _Ends(
                None,
                None,
                ends.embedding.data_ptr(),
                ends.embedding.shape[0],
                None,
                None,
                0,
                ends.norm.data_ptr(),
                ends.eps,
                _Product(head.packed, head.bias, head.compensation, head.col_scales, head.static_scale),
                head.out_features,
                None,
            )

    @staticmethod
    def build(
        layers: Sequence[StackLayer],
        shape: StackShape,
        kernels: StackKernels,
        cache_dir: Path | None = None,
        ends: StackEnds | None = None,
    ) -> DecodeStack | None:
        """The stack over these layers (and ``ends``, for whole steps: ``run_step``); None where the
        driver cannot be built (the lean step stays)."""
        missing = "the one-call decode layers are not available: decode steps keep the lean step"
        return load_kernel(
            lambda library: DecodeStack(library, kernels, layers, shape, ends), SOURCE, cache_dir, missing
        )

    def takes(self, hidden: torch.Tensor, cache_layers: Sequence[object]) -> bool:
        """Whether a step of these rows [B, hidden] over this cache can run here."""
        return hidden.dtype == self.shape.dtype and self.takes_cache(cache_layers)

    def takes_cache(self, cache_layers: Sequence[object]) -> bool:
        """Whether steps over this cache can run here (``run_step``'s rows are the stack's own): a
        layer per decoder layer, claiming positions, of a dtype the stack reads. The first layer
        answers for all (a running batch's layers are made alike); a step checks each it claims."""
        first = cache_layers[0] if cache_layers else None
        return (
            len(cache_layers) == len(self._layers)
            and getattr(first, "storage_dtype", None) in self._kernels
            and hasattr(first, "append_position")
        )

    def run(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keep: torch.Tensor | None,
        cache_layers: Sequence[CacheLayer],
    ) -> torch.Tensor:
        """Every layer over ``hidden`` [B, hidden] (updated in place: the residual stream before the
        last MLP's output is added), with ``cos``/``sin`` [B, head_dim] and ``keep`` [B, L + 1] (True
        on real positions, None without padding); appends each layer's new keys and values to its
        cache. Returns the last MLP's output [B, hidden], which the final norm adds."""
        batch, dim, dtype = hidden.shape[0], self.shape.head_dim, self.shape.dtype
        rows_of = {"hidden": (hidden, self.shape.hidden), "cos": (cos, dim), "sin": (sin, dim)}
        for name, (rows, width) in rows_of.items():
            if rows.dtype != dtype or rows.shape != (batch, width) or not rows.is_contiguous():
                raise ValueError(
                    f"{name}: contiguous {dtype} [{batch}, {width}] rows, got {rows.dtype} {list(rows.shape)}"
                )
        pending = torch.empty_like(hidden)
        self._shape.batch = batch
        scratch = torch.empty(self._scratch_size(ctypes.byref(self._shape)), dtype=dtype)
        self._call(hidden, pending, (cos, sin), keep, cache_layers, None, scratch)
        return pending

    def run_step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        keep: torch.Tensor | None,
        cache_layers: Sequence[CacheLayer],
    ) -> torch.Tensor:
        """The whole step of ``input_ids`` [B] at ``positions`` [B] (both contiguous int64): the
        embedding lookup, each row's rotary row read from ``rotary``'s tables (cos, sin: [P,
        head_dim] of the rows' dtype) at its position, every layer as ``run``, the final norm and
        the output head; returns the logits [B, vocab]. Needs ``ends``."""
        ends = self._ends
        if ends is None or self.ends is None:
            raise RuntimeError("a whole decode step needs the stack's embedding and output head")
        batch, dtype = input_ids.shape[0], self.shape.dtype
        for name, ids in (("input_ids", input_ids), ("positions", positions)):
            if ids.dtype != torch.int64 or ids.shape != (batch,) or not ids.is_contiguous():
                raise ValueError(f"{name}: contiguous int64 [{batch}], got {ids.dtype} {list(ids.shape)}")
        cos, sin = rotary
        width = (cos.shape[0], self.shape.head_dim)
        if any(t.dtype != dtype or t.shape != width or not t.is_contiguous() for t in rotary) or sin.shape != cos.shape:
            raise ValueError(f"rotary tables: two contiguous {dtype} [positions, {self.shape.head_dim}]")
        buffers = self._buffers
        if buffers is None or buffers[0].shape[0] != batch:
            self._shape.batch = batch
            hidden = torch.empty(batch, self.shape.hidden, dtype=dtype)
            scratch = torch.empty(self._scratch_size(ctypes.byref(self._shape)), dtype=dtype)
            buffers = self._buffers = (hidden, torch.empty_like(hidden), scratch)
        logits = torch.empty(batch, self.ends.head.out_features, dtype=dtype)  # the caller's to keep
        ends.ids, ends.positions, ends.logits = input_ids.data_ptr(), positions.data_ptr(), logits.data_ptr()
        ends.cos_table, ends.sin_table, ends.table_rows = cos.data_ptr(), sin.data_ptr(), cos.shape[0]
        self._call(buffers[0], buffers[1], None, keep, cache_layers, ends, buffers[2])
        return logits

    def _call(
        self,
        hidden: torch.Tensor,
        pending: torch.Tensor,
        rows: tuple[torch.Tensor, torch.Tensor] | None,
        keep: torch.Tensor | None,
        cache_layers: Sequence[CacheLayer],
        ends: _Ends | None,
        scratch: torch.Tensor,
    ) -> None:
        """The driver's call: ``rows`` the step's rotary rows (cos, sin), or None where ``ends``
        reads them from its tables; ``scratch`` of ``_scratch_size`` elements for this batch."""
        batch, dim = hidden.shape[0], self.shape.head_dim
        first = cache_layers[0]
        length = first.length + 1  # the window once this step's position is appended
        if first.rows != batch or len(cache_layers) != len(self._layers):
            raise RuntimeError(f"a cache of {first.rows} rows, {len(cache_layers)} layers for a decode step of {batch}")
        # Checked before any cache layer takes the new position.
        if keep is not None:
            if keep.shape != (batch, length):
                raise ValueError(f"a keep mask of shape {tuple(keep.shape)} for {batch} rows of {length} positions")
            # One byte per position, non-zero: attend (a bool tensor's own bytes).
            keep = keep.to(torch.bool).contiguous()
        dtype = self.shape.dtype
        elem = dtype.itemsize  # bytes an element
        cache_dtype = first.storage_dtype
        if cache_dtype is None or cache_dtype not in self._kernels:
            raise ValueError(f"a {cache_dtype} cache under {dtype} rows: the stack takes {list(self._kernels)}")
        kernels, cache_elem = self._kernels[cache_dtype], cache_dtype.itemsize
        like = self._like
        if like is None or like.shape[0] != batch or like.dtype != cache_dtype:  # shapes a grown buffer
            like = self._like = torch.empty((batch, self.shape.kv_heads, 1, dim), dtype=cache_dtype)
        windows = self._windows
        for index, layer in enumerate(cache_layers):
            keys, values, start, claimed = layer.append_position(like)
            # What the driver's reads and writes rely on, layer by layer. A layer out of step fails
            # the step (the layers before it have claimed their position, as a failing kernel leaves them).
            if claimed != length or keys.dtype != cache_dtype or keys.shape[0] < batch:
                raise RuntimeError(f"cache layer {index} out of step with the other layers of a decode step")
            # A layer's window moves only when its buffer grows or its rows change: its addresses
            # are set again only then.
            window = windows[index]
            if window is None or window[0]() is not keys or window[1]() is not values or window[2] != start:
                slot = self._layers[index]
                # Each position is ``dim`` elements: the window's first position of row 0.
                slot.keys = keys.data_ptr() + cache_elem * start * dim
                slot.values = values.data_ptr() + cache_elem * start * dim
                slot.cache_stride_b, slot.cache_stride_h = keys.stride(0), keys.stride(1)
                windows[index] = (weakref.ref(keys), weakref.ref(values), start)
        self._shape.batch, self._shape.length = batch, length
        status = self._run(
            ctypes.byref(kernels), self._layers, len(self._layers), ctypes.byref(self._shape), elem, cache_elem,
            hidden.data_ptr(), pending.data_ptr(), 0,
            rows[0].data_ptr() if rows is not None else None, rows[1].data_ptr() if rows is not None else None,
            keep.data_ptr() if keep is not None else None, keep.stride(0) if keep is not None else 0,
            scratch.data_ptr(), ctypes.byref(ends) if ends is not None else None,
        )  # fmt: skip
        if status == -101:  # before any layer ran (the caches have taken their position)
            raise ValueError("a decode step's token is outside the input embedding")
        if status == -102:
            raise ValueError("a decode step's position is outside the rotary tables")
        if status != 0:
            raise RuntimeError(f"the one-call decode layers failed with status {status} for {batch} rows")
