"""The serving path's cost at concurrency 16, measured in alternating rounds.

The issue's target "the serving path costs at most 10 % of the in-process engine's tokens/s at
C=16" is one ratio, and a single pair of runs on this machine moves it by ±10 % (each side is
noisy on its own). Each round here measures the in-process engine (a fresh interpreter) and then
the whole served path (launcher, tritonserver, frontend; a fresh server), with the same model,
prompt, request count and output length, so slow minutes of the machine fall on both sides.
Prints every round's pair and ratio, and the median ratio. ``--per-request`` adds, in each round,
the served path with ``--no-response-channel`` (one gRPC response per delta and request, as
before response channels), to show what the channel is worth on the same build. Each round also
prints the CPU every process of the served path and the load generator used during its load, as
a percentage of one core (``benchmarks.co_load`` measures what such a share costs the engine).

    python -m benchmarks.serving_cost --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --rounds 3 --stream-interval 1 [--per-request]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.compare import _isolated
from benchmarks.inprocess import engine_inprocess
from benchmarks.load import DEFAULT_PROMPT, run_load
from benchmarks.servers import CpuShares, ours, served_model_parser

CONCURRENCY = 16


@dataclass(frozen=True)
class Round:
    engine_tokens_per_s: float
    served_tokens_per_s: float
    served_errors: int
    # CPU of each process during the served load, % of one core (client = the load generator).
    served_cpu_percent: dict[str, float]
    per_request_tokens_per_s: float | None = None  # served with --no-response-channel

    @property
    def ratio(self) -> float:
        return round(self.served_tokens_per_s / self.engine_tokens_per_s, 3)

    @property
    def per_request_ratio(self) -> float | None:
        if self.per_request_tokens_per_s is None:
            return None
        return round(self.per_request_tokens_per_s / self.engine_tokens_per_s, 3)


def _served_tokens_per_s(
    model: str, dtype: str, requests: int, max_tokens: int, stream_interval: int, log: Path, *flags: str
) -> tuple[float, int, dict[str, float]]:
    server = ours(model, dtype, log, extra_args=("--stream-interval", str(stream_interval), *flags))
    server.start()
    try:
        # One untimed wave: the first requests pay for prefix-cache misses and lazy set-up.
        asyncio.run(run_load(server.base_url, "bench", CONCURRENCY, CONCURRENCY, max_tokens, DEFAULT_PROMPT, "warm"))
        with CpuShares(server.pid) as cpu:
            report = asyncio.run(
                run_load(server.base_url, "bench", CONCURRENCY, requests, max_tokens, DEFAULT_PROMPT, "served")
            )
    finally:
        server.stop()
    return report.tokens_per_s, report.errors, cpu.shares


def measure_round(
    model: str, dtype: str, requests: int, max_tokens: int, stream_interval: int, log: Path, per_request: bool
) -> Round:
    # The in-process engine also starts with an untimed request (engine_inprocess's warm-up).
    engine = _isolated(engine_inprocess, model, dtype, CONCURRENCY, requests, max_tokens, stream_interval)
    served, errors, cpu = _served_tokens_per_s(model, dtype, requests, max_tokens, stream_interval, log)
    plain = None
    if per_request:
        plain, more, _ = _served_tokens_per_s(
            model, dtype, requests, max_tokens, stream_interval, log, "--no-response-channel"
        )
        errors += more
    return Round(engine.tokens_per_s, served, errors, cpu, plain)


def main() -> None:
    parser = served_model_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=160, help="requests per measurement (10 waves of 16)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stream-interval", type=int, default=1, metavar="N", help="the server's --stream-interval")
    parser.add_argument("--per-request", action="store_true", help="also serve with --no-response-channel")
    args = parser.parse_args()
    if args.rounds < 1 or args.requests < CONCURRENCY or args.stream_interval < 1:
        parser.error("--rounds and --stream-interval must be >= 1, --requests >= 16")
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="serving-cost-") as logs:
        for index in range(args.rounds):
            log = Path(logs) / f"round-{index}.log"
            result = measure_round(
                args.model, args.dtype, args.requests, args.max_tokens, args.stream_interval, log, args.per_request
            )
            rounds.append(result)
            line = {"round": index + 1, **asdict(result), "ratio": result.ratio}
            if args.per_request:
                line["per_request_ratio"] = result.per_request_ratio
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
    summary = {
        "stream_interval": args.stream_interval,
        "median_ratio (target >= 0.9)": round(statistics.median(r.ratio for r in rounds), 3),
        "median_engine_tokens_per_s": round(statistics.median(r.engine_tokens_per_s for r in rounds), 1),
        "median_served_tokens_per_s": round(statistics.median(r.served_tokens_per_s for r in rounds), 1),
    }
    if args.per_request:
        summary["median_per_request_ratio"] = round(statistics.median(r.per_request_ratio or 0.0 for r in rounds), 3)
    sys.stdout.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
