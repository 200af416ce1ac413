"""Engine settings against each other: the same distinct-prompt traffic in-process, rounds interleaved.

Each ``--variant NAME:key=value,...`` is a set of engine settings (config.pbtxt names, as
``EngineSettings.from_parameters`` reads them) over the common ``--model``/``--dtype``; the first
variant is the reference. For every concurrency, each round runs every variant once on a fresh
engine, in an order that alternates between rounds, so that a machine getting busier or quieter
does not favour one of them. Requests are ``traffic.py``'s distinct mix (a unique first line, then
random words; outputs forced to their length), greedy. Prints one JSON line per run and, per
concurrency, the median output tokens/s of each variant and its ratio to the reference's, with
how many greedy answers differ from the reference's.

    python -m benchmarks.engine_ab --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct --dtype float32 \\
        --variant auto:kv_cache_dtype=auto --variant bf16kv:kv_cache_dtype=bfloat16 -c 16 -c 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.engine_runs import EngineRun, add_in_process_workload_arguments, run_engine
from benchmarks.traffic import build_requests, workload_from
from python_backend.protocol.settings import EngineSettings, SettingsError


@dataclass(frozen=True)
class Variant:
    name: str
    parameters: dict[str, str]


def parse_variant(text: str) -> Variant:
    """``NAME:key=value,key=value`` (``NAME:`` alone: the defaults)."""
    name, _, rest = text.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"a variant needs a name before ':', got {text!r}")
    parameters = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"variant {name!r}: expected key=value, got {item!r}")
        parameters[key.strip()] = value.strip()
    return Variant(name, parameters)


def variant_settings(variant: Variant, model: str, dtype: str, concurrency: int) -> EngineSettings:
    base = {"model_path": model, "dtype": dtype, "max_num_seqs": str(max(concurrency, 1))}
    return EngineSettings.from_parameters({**base, **variant.parameters})


def _emit(record: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=lambda text: str(Path(text).expanduser()))
    parser.add_argument("--dtype", default="float32", choices=("bfloat16", "float32"))
    parser.add_argument("--variant", action="append", type=parse_variant, required=True, help="NAME:key=value,...")
    parser.add_argument("-c", "--concurrency", action="append", type=int, help="requests in flight (repeatable)")
    parser.add_argument("-n", "--requests", type=int, help="requests per run (default 2*C)")
    parser.add_argument("--rounds", type=int, default=2)
    add_in_process_workload_arguments(parser)
    args = parser.parse_args()
    if len(args.variant) < 2:
        parser.error("give at least two --variant: the first is the reference")
    workload = workload_from(args)
    for concurrency in args.concurrency or [16]:
        requests = build_requests(workload, args.requests or 2 * concurrency)
        try:
            settings = {v.name: variant_settings(v, args.model, args.dtype, concurrency) for v in args.variant}
        except SettingsError as exc:
            parser.error(str(exc))
        runs: dict[str, list[EngineRun]] = {v.name: [] for v in args.variant}
        for round_index in range(args.rounds):
            order = args.variant if round_index % 2 == 0 else list(reversed(args.variant))
            for variant in order:
                run = run_engine(settings[variant.name], requests, concurrency)
                runs[variant.name].append(run)
                figures = {k: v for k, v in asdict(run).items() if k != "answers"}
                _emit({"variant": variant.name, "round": round_index, "workload": asdict(workload), **figures})
        reference = args.variant[0].name
        medians = {name: statistics.median(r.output_tokens_per_s for r in done) for name, done in runs.items()}
        answers = runs[reference][0].answers
        _emit(
            {
                "concurrency": concurrency,
                "requests": len(requests),
                "reference": reference,
                "median_output_tokens_per_s": medians,
                "ratio": {name: round(m / medians[reference], 3) for name, m in medians.items()},
                "answers_differing_from_reference": {
                    name: sum(a != b for a, b in zip(answers, done[0].answers, strict=True))
                    for name, done in runs.items()
                },
            }
        )


if __name__ == "__main__":
    main()
