"""What other processes' CPU on the engine's cores costs the engine, measured in-process.

The served path shares the machine's cores with the engine: the frontend, tritonserver and
(here) the load generator run between the engine's steps. torch splits each operation of a
step across its threads, so a process that takes a core from one of them for a moment stalls
the other as well. This measures that directly, without any serving code: each round runs the
in-process engine at C=16 alone, then beside a process that busies one core for ``--burst-ms``
every so often, ``--share`` of that core in all, and prints both and their ratio.

    python -m benchmarks.co_load --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --share 0.1 --rounds 2
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import sys
import time
from multiprocessing.synchronize import Event

from benchmarks.compare import _isolated
from benchmarks.inprocess import engine_inprocess
from benchmarks.servers import served_model_parser

CONCURRENCY = 16


def _busy(burst_s: float, pause_s: float, stop: Event) -> None:
    # Spins rather than sleeps for the burst: the point is to hold a core as a busy process would.
    while not stop.is_set():
        until = time.perf_counter() + burst_s
        while time.perf_counter() < until:
            pass
        time.sleep(pause_s)


def main() -> None:
    parser = served_model_parser(__doc__)
    parser.add_argument("--share", type=float, default=0.1, help="fraction of one core the other process uses")
    parser.add_argument("--burst-ms", type=float, default=1.5, help="length of each of its bursts")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    if not 0 < args.share < 1 or args.burst_ms <= 0 or args.rounds < 1 or args.requests < CONCURRENCY:
        parser.error("--share must be in (0, 1), --burst-ms > 0, --rounds >= 1, --requests >= 16")
    burst_s = args.burst_ms / 1e3
    pause_s = burst_s * (1 - args.share) / args.share
    spawn = multiprocessing.get_context("spawn")
    ratios = []
    for index in range(args.rounds):
        alone = _isolated(engine_inprocess, args.model, args.dtype, CONCURRENCY, args.requests, args.max_tokens)
        stop = spawn.Event()
        other = spawn.Process(target=_busy, args=(burst_s, pause_s, stop))
        other.start()
        try:
            beside = _isolated(engine_inprocess, args.model, args.dtype, CONCURRENCY, args.requests, args.max_tokens)
        finally:
            stop.set()
            other.join(10)
        ratio = round(beside.tokens_per_s / alone.tokens_per_s, 3)
        ratios.append(ratio)
        line = {
            "round": index + 1,
            "alone_tokens_per_s": alone.tokens_per_s,
            "beside_tokens_per_s": beside.tokens_per_s,
            "ratio": ratio,
        }
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    summary = {"other_process_share_of_one_core": args.share, "burst_ms": args.burst_ms}
    sys.stdout.write(json.dumps({**summary, "median_ratio": statistics.median(ratios)}) + "\n")


if __name__ == "__main__":
    main()
