"""What the batch-invariant mode costs: the engine in-process, distinct prompts, mode off and on.

For each mode and each concurrency, the same requests (``traffic.py``'s distinct mix: a unique
first line, then random words; output lengths forced with ``ignore_eos``) go to the engine with
at most C in flight, greedy. Prints one JSON line per run (output tokens/s, wall time) and, per
mode, how many answers differ between concurrency 1 and the largest one: the same prompt alone
and among others, which the mode makes zero.

    python -m benchmarks.batch_invariant --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.engine_runs import add_in_process_workload_arguments, run_engine
from benchmarks.traffic import TrafficRequest, build_requests, workload_from
from python_backend.protocol.settings import EngineSettings


@dataclass(frozen=True)
class ModeRun:
    batch_invariant: bool
    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float


def run_mode(
    model: str, dtype: str, invariant: bool, concurrency: int, requests: list[TrafficRequest]
) -> tuple[ModeRun, list[str]]:
    """The requests through a fresh engine, at most ``concurrency`` at a time; the run and each answer."""
    settings = EngineSettings(
        model_path=model, dtype=dtype, max_num_seqs=max(concurrency, 1), batch_invariant=invariant
    )
    run = run_engine(settings, requests, concurrency)
    mode = ModeRun(invariant, concurrency, run.requests, run.output_tokens, run.wall_s, run.output_tokens_per_s)
    return mode, run.answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=lambda text: str(Path(text).expanduser()))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--concurrency", default="1,16", help="comma-separated C values")
    parser.add_argument("--requests", type=int, default=16)
    add_in_process_workload_arguments(parser)
    args = parser.parse_args()
    workload = workload_from(args)
    requests = build_requests(workload, args.requests)
    levels = [int(c) for c in args.concurrency.split(",")]
    for invariant in (False, True):
        answers = []
        for concurrency in levels:
            run, texts = run_mode(args.model, args.dtype, invariant, concurrency, requests)
            answers.append(texts)
            sys.stdout.write(json.dumps({"workload": asdict(workload), **asdict(run)}) + "\n")
            sys.stdout.flush()
        differ = sum(a != b for a, b in zip(answers[0], answers[-1], strict=True))
        summary = {
            "batch_invariant": invariant,
            "answers_differing_between_c": [levels[0], levels[-1]],
            "differ": differ,
        }
        sys.stdout.write(json.dumps({**summary, "of": len(requests)}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
