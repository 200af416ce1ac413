"""Quantized linear products against bfloat16 ones, on a model's shapes (docs/quantization.md).

Times one model pass of linear products (per layer the merged q/k/v and gate/up, the output and
down projections, each layer with weights of its own) at each row count, in every form the engine
can run them:

- ``bf16``: ``PackedLinear`` as a bfloat16 model runs it: our kernel (``cpu/bf16_gemm.py``) where
  the CPU takes it, else oneDNN's (where oneDNN cannot prepack bfloat16, as on AVX2-only CPUs, the
  plain ``torch.nn.Linear`` the engine keeps there);
- ``bf16-onednn``: ``PackedLinear`` on oneDNN's product (weight prepacked once; same fallback);
- ``f32``: ``PackedLinear`` in float32, what ``--dtype auto`` runs where oneDNN has no bfloat16;
- ``w8a8``: ``QuantLinear`` as the engine runs it: our int8 product (``cpu/int8_gemm.py``: its
  AVX512-VNNI build, else its AVX2 one) where the CPU has it, else ``torch._int_mm`` with the row
  passes in C;
- ``w8a8-intmm``: ``torch._int_mm`` with the row passes in C (``cpu/int8_rows.py``);
- ``w8a8-torch``: ``torch._int_mm`` with the two passes in PyTorch (where no C compiler is found);
- ``w8a8-onednn``: not an engine kernel, a candidate: oneDNN's ``qlinear_pointwise`` (what Inductor's
  x86 quantizer emits), rows quantized to uint8 with one dynamic scale for the whole input (it
  takes no per-token scales), weights prepacked by ``qlinear_prepack``;
- ``w8a16``: ``QuantLinear`` ``int8pack`` (``aten._weight_int8pack_mm``);
- ``w4a16-g32`` / ``w4a16-g64``: ``QuantLinear`` ``int4pack`` (``aten._weight_int4pack_mm_for_cpu``;
  the demo model's width, 576, takes no group of 128).

With ``--head`` it times the output head instead (``vocab_size`` x ``hidden_size``, once a pass), as
``--quantize-lm-head`` makes it ``w8a8``.

Weights are random (the kernels' speed does not depend on the values). The quantized forms take
and give rows of ``--dtype`` (default: bfloat16 where oneDNN has bfloat16 kernels, else float32, as
``--dtype auto`` serves). Prints a table: milliseconds per model pass for each form and row count,
and each form's time over the base form's (``bf16``, or ``f32`` where oneDNN has no bfloat16). Run it on a quiet
machine: every figure is the median of ``--repeats`` passes after ``--warmup`` ones.

    python -m benchmarks.quant_products --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct
    python -m benchmarks.quant_products --head --forms f32,w8a8 --rows 1,4,16,64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# SmolLM2-135M-Instruct (the demo model), when no --model is given.
_DEMO = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
}
FORMS = (
    "bf16",
    "bf16-onednn",
    "f32",
    "w8a8",
    "w8a8-intmm",
    "w8a8-torch",
    "w8a8-onednn",
    "w8a16",
    "w4a16-g32",
    "w4a16-g64",
)


@dataclass(frozen=True)
class Shape:
    name: str
    n: int  # output features
    k: int  # input features


def model_shapes(config: dict[str, Any]) -> tuple[list[Shape], int]:
    """The per-layer products of a Llama-like config, and its layer count."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    intermediate = int(config["intermediate_size"])
    shapes = [
        Shape("qkv", (heads + 2 * kv_heads) * head_dim, hidden),
        Shape("o", hidden, heads * head_dim),
        Shape("gate_up", 2 * intermediate, hidden),
        Shape("down", hidden, intermediate),
    ]
    return shapes, int(config["num_hidden_layers"])


def head_shape(config: dict[str, Any]) -> Shape:
    """The output head's product: [vocab_size, hidden_size]."""
    return Shape("head", int(config["vocab_size"]), int(config["hidden_size"]))


def _product(form: str, weight: Any, dtype: Any) -> Callable[[Any], Any]:
    """The form's product for one float weight [N, K], on rows of ``dtype`` (the quantized forms)."""
    import torch

    from python_backend.cpu.bf16_gemm import build_bf16_gemm
    from python_backend.cpu.int8_rows import build_int8_rows_kernel
    from python_backend.cpu.linear import PackedLinear, prepack_supported
    from python_backend.cpu.quant_linear import Int8Paths, QuantLinear, QuantWeight, quantize_per_channel

    cpu = torch.device("cpu")
    if form in ("bf16", "bf16-onednn", "f32"):
        float_dtype = torch.float32 if form == "f32" else torch.bfloat16
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=float_dtype)
        linear.weight.data = weight.to(float_dtype)
        if not prepack_supported(cpu, float_dtype):
            return linear.forward
        return PackedLinear(linear, build_bf16_gemm() if form == "bf16" else None).apply_unchecked
    int8 = quantize_per_channel(weight)
    if form == "w8a8-onednn":
        return _onednn_product(int8.values, int8.scale.reshape(-1), dtype)
    if form in ("w8a8", "w8a8-intmm", "w8a8-torch", "w8a16"):
        activations = "none" if form == "w8a16" else "dynamic"
        quant = QuantWeight(int8.values, int8.scale, None, 8, int8.group_size, activations)
        paths = {"w8a8": Int8Paths.build, "w8a8-intmm": lambda: Int8Paths(build_int8_rows_kernel())}
        int8_paths = paths[form]() if form in paths else None
        if int8_paths is not None and int8_paths.rows is None and int8_paths.gemm is None:
            raise SystemExit(f"{form}: no C int8 path built (see the log); time w8a8-torch instead")
        return QuantLinear(quant, None, dtype, cpu, int8_paths).apply_unchecked
    group = int(form.rsplit("g", 1)[1])
    blocks = weight.float().unflatten(1, (-1, group))
    scale = (blocks.abs().amax(-1) / 7).clamp(min=1e-8)
    values = torch.round(blocks / scale.unsqueeze(-1)).clamp(-8, 7).to(torch.int8).flatten(1)
    quant = QuantWeight(values, scale, None, 4, group, "none")
    return QuantLinear(quant, None, dtype, cpu).apply_unchecked


def _onednn_product(levels: Any, scale: Any, dtype: Any) -> Callable[[Any], Any]:
    """oneDNN's quantized linear with a dynamic per-tensor uint8 input (its signed-int8 input path is
    far slower on the machines tried)."""
    import torch

    packed = torch.ops.onednn.qlinear_prepack(levels, None)
    zeros = torch.zeros(levels.shape[0], dtype=torch.int64)

    def product(x: Any) -> Any:
        rows = x.float()
        x_scale = float(rows.abs().amax()) / 127 or 1.0
        quantized = (torch.round(rows / x_scale) + 128).clamp(0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(
            quantized, x_scale, 128, packed, scale, zeros, None, 1.0, 0, dtype, "none", [], ""
        )

    return product


def row_dtype(form: str, dtype: Any) -> Any:
    """The dtype of ``form``'s rows: its own for the float forms, ``dtype`` for the quantized ones."""
    import torch

    return {"bf16": torch.bfloat16, "bf16-onednn": torch.bfloat16, "f32": torch.float32}.get(form, dtype)


def default_dtype() -> Any:
    """What ``--dtype auto`` serves: bfloat16 where oneDNN has bfloat16 kernels, else float32."""
    import torch

    from python_backend.cpu.linear import onednn_has_bfloat16

    return torch.bfloat16 if onednn_has_bfloat16() else torch.float32


def time_form(
    form: str, shapes: list[Shape], layers: int, rows: int, warmup: int, repeats: int, dtype: Any = None
) -> float:
    """Median milliseconds of one model pass of ``form``'s products at ``rows`` rows of ``dtype``
    (the quantized forms; None: ``default_dtype()``)."""
    import torch

    dtype = dtype if dtype is not None else default_dtype()
    generator = torch.Generator().manual_seed(0)
    products = [
        (shape, _product(form, torch.randn(shape.n, shape.k, generator=generator) * 0.05, dtype))
        for _ in range(layers)
        for shape in shapes
    ]
    rows_dtype = row_dtype(form, dtype)
    inputs = {shape.k: torch.randn(rows, shape.k, generator=generator).to(rows_dtype) for shape in shapes}
    times = []
    with torch.inference_mode():
        for index in range(warmup + repeats):
            started = time.perf_counter()
            for shape, product in products:
                product(inputs[shape.k])
            if index >= warmup:
                times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, help="model folder whose config.json gives the shapes (default: the demo model's)"
    )
    parser.add_argument("--rows", default="1,16,64,576", help="comma-separated row counts (default: 1,16,64,576)")
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated forms (default: {','.join(FORMS)})")
    parser.add_argument("--layers", type=int, default=0, help="layers to time (default: the model's)")
    parser.add_argument("--head", action="store_true", help="time the output head instead of the decoder layers")
    parser.add_argument("--warmup", type=int, default=3, help="untimed passes first (default: 3)")
    parser.add_argument("--repeats", type=int, default=15, help="timed passes; the median is reported (default: 15)")
    parser.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="rows of the quantized forms (default: auto, bfloat16 where oneDNN has bfloat16 kernels, else float32)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.forms.split(",")) - set(FORMS)
    if unknown:
        parser.error(f"--forms: unknown {', '.join(sorted(unknown))} (choose from {', '.join(FORMS)})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = json.loads((args.model / "config.json").read_text()) if args.model else _DEMO
    shapes, layers = model_shapes(config)
    layers = args.layers or layers
    if args.head:
        shapes, layers = [head_shape(config)], 1
    rows = [int(r) for r in args.rows.split(",")]
    forms = args.forms.split(",")
    import torch

    dtype = default_dtype() if args.dtype == "auto" else getattr(torch, args.dtype)
    table = {(f, r): time_form(f, shapes, layers, r, args.warmup, args.repeats, dtype) for f in forms for r in rows}
    base_form = "bf16" if dtype == torch.bfloat16 else "f32"
    for (form, count), ms in table.items():
        print(json.dumps({"form": form, "rows": count, "ms_per_pass": round(ms, 3)}))
    width = max(len(f) for f in forms)
    products = ", ".join(f"{s.name} {s.n}x{s.k}" for s in shapes)
    print(f"\nms per model pass ({products if args.head else f'{layers} layers: {products}'}), {dtype} rows")
    print(f"(time over {base_form}'s)")
    print(f"{'form':<{width}} " + " ".join(f"{f'rows {r}':>16}" for r in rows))
    for form in forms:
        cells = []
        for count in rows:
            ms = table[(form, count)]
            base = table.get((base_form, count))
            cells.append(f"{ms:8.2f}" + (f" ({ms / base:4.2f}x)" if base else " " * 8))
        print(f"{form:<{width}} " + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
