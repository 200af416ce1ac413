"""What vLLM's router adds in front of triton-chat replicas: the same traffic direct and through it.

Starts ``--replicas`` servers of ``triton-chat serve`` (the demo model unless ``--model``) and
``vllm-router`` over them (``--policy``, round_robin by default), warms both paths up, then runs
``--rounds`` pairs of loads: direct (the client hands its connections to the replicas in turn, so
each keeps C/N requests in flight, as a round-robin router would) and through the router. The
order inside a pair alternates, so a drift of the machine's speed weighs on both paths alike, and
every run has prompts of its own (``Workload.variant``), so no run reads another's prefix cache.
Prints one JSON line per run, then one with each figure's median ratio router ÷ direct over the
rounds and the overhead in percent (TTFT p50/p99, ITL p50/p99; throughput as direct ÷ router).
On a machine whose cores the servers compute on, the router's own CPU is part of its cost.

    python -m benchmarks.router_overhead -c 16 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.servers import ServedProcess, exit_on_sigterm, ours, vllm_router
from benchmarks.traffic import TrafficReport, add_workload_arguments, run_traffic, workload_from

_TIMEOUT_S, _DEADLINE_S = 300.0, 1800.0
_FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")


@dataclass(frozen=True)
class Overhead:
    """Median over the rounds of router ÷ direct per figure, and what that is in percent."""

    rounds: int
    concurrency: int
    replicas: int
    policy: str
    ratios: dict[str, float]
    overhead_percent: dict[str, float]
    errors_direct: int
    errors_router: int


def router_binary(given: str | None) -> str:
    found = given or shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which("vllm-router")
    if found is None:
        raise SystemExit("vllm-router not found: pip install vllm-router (the test extra has it), or pass --router")
    return found


def overhead(
    pairs: list[tuple[TrafficReport, TrafficReport]], policy: str, concurrency: int, replicas: int
) -> Overhead:
    """Each figure's median ratio router ÷ direct over ``pairs`` of (direct, router) runs."""
    ratios: dict[str, float] = {}
    for name in _FIGURES:
        ratios[name] = statistics.median(getattr(r, name) / getattr(d, name) for d, r in pairs if getattr(d, name))
    # Throughput: how much longer the same tokens took through the router.
    ratios["output_tokens_per_s"] = statistics.median(
        d.output_tokens_per_s / r.output_tokens_per_s for d, r in pairs if r.output_tokens_per_s
    )
    return Overhead(
        rounds=len(pairs),
        concurrency=concurrency,
        replicas=replicas,
        policy=policy,
        ratios={k: round(v, 3) for k, v in ratios.items()},
        overhead_percent={k: round(100 * (v - 1), 1) for k, v in ratios.items()},
        errors_direct=sum(d.errors for d, _ in pairs),
        errors_router=sum(r.errors for _, r in pairs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="local model folder (default: the demo model)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--policy", default="round_robin", help="the router's --policy")
    parser.add_argument("--router", default=None, help="the vllm-router binary (default: found beside python)")
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("-n", "--requests", type=int, default=0, help="per run; default 2*C")
    parser.add_argument("--rounds", type=int, default=3)
    add_workload_arguments(parser)
    args = parser.parse_args()
    if args.replicas < 1 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--replicas, --rounds and -c/--concurrency must be at least 1")
    requests = args.requests or 2 * args.concurrency
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    binary = router_binary(args.router)
    workload = workload_from(args)
    out = Path(tempfile.mkdtemp(prefix="router-overhead-"))

    def run(target: str | list[str], label: str, variant: int) -> TrafficReport:
        load = replace(workload, variant=variant)
        return asyncio.run(
            run_traffic(target, "bench", load, requests, args.concurrency, None, label, _TIMEOUT_S, _DEADLINE_S)
        )

    with ExitStack() as stack:
        replicas = [
            ours(args.model, args.dtype, out / f"replica{i}.log", label=f"replica{i}") for i in range(args.replicas)
        ]
        for server in replicas:
            server.start()
            stack.callback(server.stop)
        roots = [s.base_url.removesuffix("/v1") for s in replicas]
        router: ServedProcess = vllm_router(binary, roots, args.policy, out / "router.log")
        router.start()
        stack.callback(router.stop)
        direct_urls = [s.base_url for s in replicas]
        variant = 1
        order: list[tuple[str, str | list[str]]] = [("direct", direct_urls), ("router", router.base_url)]
        for label, target in order:
            run(target, f"warm-up {label}", variant)
            variant += 1
        pairs: list[tuple[TrafficReport, TrafficReport]] = []
        for index in range(args.rounds):
            reports: dict[str, TrafficReport] = {}
            for label, target in order if index % 2 == 0 else order[::-1]:
                reports[label] = run(target, label, variant)
                variant += 1
                print(json.dumps(asdict(reports[label])), flush=True)
            pairs.append((reports["direct"], reports["router"]))
    print(json.dumps(asdict(overhead(pairs, args.policy, args.concurrency, args.replicas))), flush=True)


if __name__ == "__main__":
    main()
