"""Distinct-prompt traffic against triton-chat and vLLM's CPU build, one server at a time.

Starts each server on the same model folder, runs ``benchmarks.traffic`` at each concurrency
(closed loop, 2×C requests), stops it, and prints one JSON line per run, then a Markdown table
with each figure's ratio to vLLM measured in the same sitting. Without ``--vllm-python`` only
triton-chat runs (with and without the prefix cache). With ``--hog N`` each load also runs beside
N busy single-threaded processes (right after it alone, on the same server), and a second table
gives each server's beside/alone ratios. ``--servers`` picks which of the three run (e.g. only
``vllm`` to re-measure the reference). A SIGTERM (a timeout) stops the servers before exiting.

    python -m benchmarks.traffic_compare --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --vllm-python /work/peer/vllm-venv/bin/python -c 16 -c 64 --hog 1
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.servers import ServedProcess, exit_on_sigterm, ours, served_model_parser, vllm
from benchmarks.traffic import (
    TrafficReport,
    Workload,
    add_workload_arguments,
    alone_and_beside,
    hog_ratios,
    run_traffic,
    workload_from,
)

_TIMEOUT_S, _DEADLINE_S = 300.0, 1800.0
_SERVERS = ("ours", "ours-nocache", "vllm")


def _run(
    server: ServedProcess, workload: Workload, concurrencies: list[int], slo: tuple[float, float], hog: int
) -> list[TrafficReport]:
    server.start()
    try:
        reports: list[TrafficReport] = []
        for c in concurrencies:

            def run(load: Workload, c: int = c) -> TrafficReport:
                return asyncio.run(
                    run_traffic(
                        server.base_url, "bench", load, 2 * c, c, None, server.label, _TIMEOUT_S, _DEADLINE_S, *slo
                    )
                )

            reports.extend(alone_and_beside(run, workload, hog, _DEADLINE_S + 60.0) if hog else [run(workload)])
        return reports
    finally:
        server.stop()


def _arrivals(report: TrafficReport) -> str:
    return f"{report.arrivals}, beside {report.hog} busy" if report.hog else report.arrivals


def markdown(reports: list[TrafficReport]) -> str:
    """One row per run; the output tok/s ratio against vLLM's run at the same concurrency (and
    beside as many busy processes); then, for runs beside busy processes, their ratios to alone."""
    reference = {(r.arrivals, r.hog): r.output_tokens_per_s for r in reports if r.label == "vllm-cpu"}
    lines = [
        "| server | arrivals | output tok/s | vs vLLM | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | goodput (req/s) | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        base = reference.get((r.arrivals, r.hog))
        ratio = f"{r.output_tokens_per_s / base:.2f}" if base else "—"
        lines.append(
            f"| {r.label} | {_arrivals(r)} | {r.output_tokens_per_s:.1f} | {ratio} | {r.ttft_p50_ms:.0f} / "
            f"{r.ttft_p99_ms:.0f} | {r.itl_p50_ms:.1f} / {r.itl_p99_ms:.1f} | {r.goodput_rps:.2f} | {r.errors} |"
        )
    alone = {(r.label, r.arrivals): r for r in reports if not r.hog}
    pairs = [(alone[(r.label, r.arrivals)], r) for r in reports if r.hog and (r.label, r.arrivals) in alone]
    if pairs:
        lines += [
            "",
            "| server | arrivals | busy processes | tok/s alone / beside | throughput ratio | ITL p99 ratio | TTFT p99 ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for first, second in pairs:
            h = hog_ratios(first, second)
            lines.append(
                f"| {h.label} | {h.arrivals} | {h.hog} | {h.output_tokens_per_s_alone:.1f} / "
                f"{h.output_tokens_per_s_beside:.1f} | {h.throughput_ratio:.2f} | {h.itl_p99_ratio:.2f} | "
                f"{h.ttft_p99_ratio:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = served_model_parser(__doc__)
    parser.add_argument("-c", "--concurrency", type=int, action="append", help="repeatable; default 16")
    parser.add_argument("--vllm-python", default=None, help="the python of a venv with vllm-cpu")
    parser.add_argument("--mix", default="distinct")
    add_workload_arguments(parser)
    parser.add_argument("--hog", type=int, default=0, help="also run each load beside N busy single-threaded processes")
    parser.add_argument(
        "--ours-arg",
        action="append",
        help="a `serve` flag for triton-chat's runs (repeatable), e.g. --ours-arg=--no-cpu-adaptive-threads",
    )
    parser.add_argument(
        "--servers",
        default=",".join(_SERVERS),
        help=f"comma-separated, from {', '.join(_SERVERS)} (vllm needs --vllm-python)",
    )
    args = parser.parse_args()
    if args.hog < 0:
        parser.error("--hog must be >= 0")
    chosen = [name.strip() for name in args.servers.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(_SERVERS))
    if unknown or not chosen:
        parser.error(f"--servers: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(_SERVERS)}")
    if "vllm" in chosen and not args.vllm_python:
        parser.error("--servers vllm needs --vllm-python")
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    concurrencies = args.concurrency or [16]
    workload = workload_from(args, args.mix, shared_len=512)
    slo = (1.0, 0.1)
    reports: list[TrafficReport] = []
    with tempfile.TemporaryDirectory(prefix="traffic-compare-") as logs:
        flags = tuple(args.ours_arg or ())
        label = " ".join(("triton-chat", *flags))
        servers: list[ServedProcess] = []
        if "ours" in chosen:
            servers.append(
                replace(ours(args.model, args.dtype, Path(logs) / "ours.log", extra_args=flags), label=label)
            )
        if "ours-nocache" in chosen:
            nocache = ours(
                args.model,
                args.dtype,
                Path(logs) / "ours-nocache.log",
                extra_args=(*flags, "--no-enable-prefix-caching"),
            )
            servers.append(replace(nocache, label=f"{label}, prefix cache off"))
        if "vllm" in chosen and args.vllm_python:
            servers.append(vllm(args.vllm_python, args.model, args.dtype, Path(logs) / "vllm.log"))
        for server in servers:
            for report in _run(server, workload, concurrencies, slo, args.hog):
                reports.append(report)
                sys.stdout.write(json.dumps(asdict(report)) + "\n")
                sys.stdout.flush()
    sys.stdout.write(markdown(reports) + "\n")


if __name__ == "__main__":
    main()
