"""Where an engine step's time goes, in-process: products, attention, norms, sampling, the rest.

Runs ``traffic.py``'s distinct workload through a fresh engine per ``--variant`` (``engine_ab.py``'s
form) with timers wrapped, in this process only, around the step's parts:

- ``products``: the linear products (prepacked bfloat16, quantized, merged q/k/v and gate/up, the
  latter with its SiLU where the product ends in it);
- ``output head``: the vocabulary projection (a product too, kept apart: it is the widest);
- ``attention``: decode attention and the prompt segments' attention;
- ``decode layers, one call``: every decoder layer of a step without prompt tokens, where they run
  in one native call (``cpu/decode_stack.py``: its products, attention and norms are inside);
- ``norms``: RMSNorm with the residual add before it; ``rotary``: the rotary embedding;
- ``sampling``: picking the next tokens from the logits;
- ``scheduling``: planning the step (admission, prefill chunks, prefix-cache lookups);
- ``tokens out``: accepting tokens, detokenizing and handing deltas to their requests;
- ``rest of step``: everything else inside a step (embedding, SiLU and the gate product, cache
  writes, tensor plumbing, Python);
- ``between steps``: the engine loop outside steps (waiting for work, the heap's upkeep).

A part's time is its own: a timer nested inside another is taken out of the outer one. The
timers themselves cost about a microsecond per call (a few hundred calls per step). Prints one
JSON line per variant (tok/s, steps, milliseconds per step of each part and its share) and a
Markdown table. Serving adds the stub's sending, Triton, gRPC and the frontend on the same cores:
``serving_cost.py`` measures those.

    python -m benchmarks.step_breakdown --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --dtype bfloat16 -c 16 --variant bf16: --variant int8:quantization=int8
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.engine_ab import Variant, parse_variant, variant_settings
from benchmarks.engine_runs import EngineRun, add_in_process_workload_arguments, run_engine
from benchmarks.traffic import build_requests, workload_from
from python_backend.protocol.settings import SettingsError

_HEAD_MARK = "_step_breakdown_output_head"  # set on the loaded model's output head module
PARTS = (
    "products",
    "output head",
    "attention",
    "decode layers, one call",
    "norms",
    "rotary",
    "sampling",
    "scheduling",
    "tokens out",
    "rest of step",
    "between steps",
)


@dataclass
class Timers:
    """Seconds per part, each part's own (nested parts taken out), on whichever thread runs them."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _local: threading.local = field(default_factory=threading.local)

    def wrap(self, part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append(0.0)  # time spent in parts nested in this call
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                nested = stack.pop()
                self.seconds[part] += spent - nested
                self.calls[part] += 1
                if stack:
                    stack[-1] += spent

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


@contextmanager
def instrumented(timers: Timers) -> Iterator[None]:
    """The engine's parts wrapped by ``timers`` while the block runs (module and class attributes
    of this process), then put back."""
    from benchmarks import engine_runs
    from python_backend.cpu import fast_decode
    from python_backend.cpu.decode_stack import DecodeStack
    from python_backend.cpu.fused_norm import FusedRMSNorm
    from python_backend.cpu.fused_projections import FusedProjections
    from python_backend.cpu.linear import PackedLinear
    from python_backend.cpu.quant_install import QuantFusedProjections
    from python_backend.cpu.quant_linear import QuantLinear
    from python_backend.cpu.row_tiles import PackedProduct
    from python_backend.engine import steps

    def head_or_product(function: Callable[..., Any]) -> Callable[..., Any]:
        product, head = timers.wrap("products", function), timers.wrap("output head", function)

        def either(module: Any, *args: Any, **kwargs: Any) -> Any:
            return (head if getattr(module, _HEAD_MARK, False) else product)(module, *args, **kwargs)

        return either

    def marking_the_head(load: Callable[..., Any]) -> Callable[..., Any]:
        def load_and_mark(*args: Any, **kwargs: Any) -> Any:
            loaded = load(*args, **kwargs)
            head = loaded.transformers_model.get_output_embeddings()
            if head is not None:
                setattr(head, _HEAD_MARK, True)
            return loaded

        return load_and_mark

    patches: list[tuple[Any, str, Callable[..., Any]]] = [
        (engine_runs, "load_model", marking_the_head),
        # PackedLinear's, FusedProjections' and QuantLinear's product (only the head is ever marked).
        (PackedProduct, "apply_unchecked", head_or_product),
        (PackedLinear, "forward", head_or_product),
        (QuantLinear, "apply_unchecked", head_or_product),  # the head too, under --quantize-lm-head
        (QuantFusedProjections, "apply_unchecked", lambda f: timers.wrap("products", f)),
        # The gate/up product that ends in SiLU (a product, its SiLU inside).
        (FusedProjections, "silu_mul_unchecked", lambda f: timers.wrap("products", f)),
        (QuantFusedProjections, "silu_mul_unchecked", lambda f: timers.wrap("products", f)),
        (fast_decode, "one_row_attention", lambda f: timers.wrap("attention", f)),
        (DecodeStack, "run", lambda f: timers.wrap("decode layers, one call", f)),
        (fast_decode, "prompt_attention", lambda f: timers.wrap("attention", f)),
        (fast_decode, "_add_norm", lambda f: timers.wrap("norms", f)),
        (FusedRMSNorm, "forward", lambda f: timers.wrap("norms", f)),
        (fast_decode.FastDecoder, "_rotate", lambda f: timers.wrap("rotary", f)),
        (steps, "sample", lambda f: timers.wrap("sampling", f)),
        (steps.StepRunner, "_plan_step", lambda f: timers.wrap("scheduling", f)),
        (steps.StepRunner, "_after_tokens", lambda f: timers.wrap("tokens out", f)),
        (steps.StepRunner, "step", lambda f: timers.wrap("rest of step", f)),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    try:
        for owner, name, wrap in patches:
            setattr(owner, name, wrap(getattr(owner, name)))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@dataclass(frozen=True)
class Breakdown:
    variant: str
    concurrency: int
    output_tokens_per_s: float
    itl_ms_p50: float
    steps: int
    ms_per_step: dict[str, float]
    share: dict[str, float]


def breakdown_of(name: str, run: EngineRun, timers: Timers) -> Breakdown:
    """Milliseconds per step of each part, ``between steps`` being the wall time no step covers."""
    seconds = dict(timers.seconds)
    in_steps = sum(seconds.get(part, 0.0) for part in PARTS if part != "between steps")
    seconds["between steps"] = max(run.wall_s - in_steps, 0.0)
    steps = max(timers.calls.get("rest of step", 0), 1)
    total = sum(seconds.get(part, 0.0) for part in PARTS) or 1.0
    return Breakdown(
        variant=name,
        concurrency=run.concurrency,
        output_tokens_per_s=run.output_tokens_per_s,
        itl_ms_p50=run.itl_ms_p50,
        steps=steps,
        ms_per_step={part: round(seconds.get(part, 0.0) * 1e3 / steps, 3) for part in PARTS},
        share={part: round(seconds.get(part, 0.0) / total, 3) for part in PARTS},
    )


def table(rows: list[Breakdown]) -> str:
    """Markdown: one column per variant and concurrency, ms per step (share) per part."""
    heads = [f"{r.variant}, C={r.concurrency}" for r in rows]
    lines = ["| part | " + " | ".join(heads) + " |", "|---|" + "---|" * len(rows)]
    for part in PARTS:
        cells = [f"{r.ms_per_step[part]:.2f} ({r.share[part]:.0%})" for r in rows]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    lines.append("| steps; output tok/s | " + " | ".join(f"{r.steps}; {r.output_tokens_per_s}" for r in rows) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=lambda text: str(Path(text).expanduser()))
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--variant", type=parse_variant, action="append", help="NAME:key=value,... (repeatable)")
    parser.add_argument("-c", "--concurrency", type=int, action="append", help="requests in flight (repeatable)")
    parser.add_argument("-n", "--requests", type=int, default=0, help="requests per run (default: 2x C)")
    add_in_process_workload_arguments(parser)
    args = parser.parse_args(argv)
    variants: list[Variant] = args.variant or [parse_variant("defaults:")]
    rows = []
    workload = workload_from(args)
    for concurrency in args.concurrency or [16]:
        # Every run is a fresh engine (an empty prefix cache): the same prompts compare variants.
        requests = build_requests(workload, args.requests or 2 * concurrency)
        for variant in variants:
            try:
                settings = variant_settings(variant, args.model, args.dtype, concurrency)
            except SettingsError as exc:
                parser.error(str(exc))
            timers = Timers()
            with instrumented(timers):
                # The timers count from the first timed request, not the load and the warm-up.
                run = run_engine(settings, requests, concurrency, on_started=timers.reset)
            row = breakdown_of(variant.name, run, timers)
            sys.stdout.write(json.dumps(row.__dict__) + "\n")
            sys.stdout.flush()
            rows.append(row)
    sys.stdout.write(table(rows) + "\n")


if __name__ == "__main__":
    main()
