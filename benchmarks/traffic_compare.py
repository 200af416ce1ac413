"""Distinct-prompt traffic against triton-chat and vLLM's CPU build, one server at a time.

Starts each server on the same model folder, runs ``benchmarks.traffic`` at each concurrency
(closed loop, 2×C requests), stops it, and prints one JSON line per run, then a Markdown table
with each figure's ratio to vLLM measured in the same sitting. Without ``--vllm-python`` only
triton-chat runs (with and without the prefix cache). With ``--hog N`` each load also runs beside
N busy single-threaded processes (right after it alone, on the same server) and alone again from
the moment they end, each run on prompts of its own; a second table gives each server's beside/
alone ratios, again/alone and the seconds until its output rate was back to 0.95x alone (see
``benchmarks.traffic``). ``--servers`` picks which of the three run (e.g. only ``vllm`` to
re-measure the reference). A SIGTERM (a timeout) stops the servers before exiting.

    python -m benchmarks.traffic_compare --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --vllm-python /work/peer/vllm-venv/bin/python -c 16 -c 64 --hog 1
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.cpu_hog import BESIDE_MAX_TTFT_P99_RATIO, BESIDE_MIN_RATIO, RECOVERY_LEVEL, RECOVERY_LIMIT_S
from benchmarks.servers import ServedProcess, exit_on_sigterm, ours, served_model_parser, vllm
from benchmarks.traffic import (
    Arrival,
    HogRatios,
    TrafficReport,
    Workload,
    add_workload_arguments,
    alone_beside_again,
    run_traffic,
    workload_from,
)

_TIMEOUT_S, _DEADLINE_S = 300.0, 1800.0
_SERVERS = ("ours", "ours-nocache", "vllm")


def _run(
    server: ServedProcess, workload: Workload, concurrencies: list[int], slo: tuple[float, float], hog: int
) -> tuple[list[TrafficReport], list[HogRatios]]:
    server.start()
    try:
        reports: list[TrafficReport] = []
        ratios: list[HogRatios] = []
        for c in concurrencies:

            def run(
                load: Workload, *, warmup: bool = True, arrivals: list[Arrival] | None = None, c: int = c
            ) -> TrafficReport:
                return asyncio.run(
                    run_traffic(
                        server.base_url,
                        "bench",
                        load,
                        2 * c,
                        c,
                        None,
                        server.label,
                        _TIMEOUT_S,
                        _DEADLINE_S,
                        *slo,
                        warmup=warmup,
                        arrivals=arrivals,
                    )
                )

            if hog:
                runs = alone_beside_again(run, workload, hog, _DEADLINE_S + 60.0)
                reports.extend((runs.alone, runs.beside, runs.again))
                ratios.append(runs.ratios)
            else:
                reports.append(run(workload))
        return reports, ratios
    finally:
        server.stop()


def _arrivals(report: TrafficReport) -> str:
    if report.hog:
        return f"{report.arrivals}, beside {report.hog} busy"
    if report.after_hog:
        return f"{report.arrivals}, alone again after {report.after_hog} busy"
    return report.arrivals


def markdown(reports: list[TrafficReport], ratios: Sequence[HogRatios] = ()) -> str:
    """One row per run; the output tok/s ratio against vLLM's run at the same concurrency (and
    beside, or right after, as many busy processes); then, for each load run alone, beside busy
    processes and alone again, its ratios to the first run alone and the seconds to recover."""
    reference = {(r.arrivals, r.hog, r.after_hog): r.output_tokens_per_s for r in reports if r.label == "vllm-cpu"}
    lines = [
        "| server | arrivals | output tok/s | vs vLLM | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | goodput (req/s) | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        base = reference.get((r.arrivals, r.hog, r.after_hog))
        ratio = f"{r.output_tokens_per_s / base:.2f}" if base else "—"
        lines.append(
            f"| {r.label} | {_arrivals(r)} | {r.output_tokens_per_s:.1f} | {ratio} | {r.ttft_p50_ms:.0f} / "
            f"{r.ttft_p99_ms:.0f} | {r.itl_p50_ms:.1f} / {r.itl_p99_ms:.1f} | {r.goodput_rps:.2f} | {r.errors} |"
        )
    if ratios:
        lines += [
            "",
            f"| server | arrivals | busy processes | tok/s alone / beside / again | beside ÷ alone (≥ {BESIDE_MIN_RATIO:g}) "
            f"| ITL p99 ratio | TTFT p99 ratio (≤ {BESIDE_MAX_TTFT_P99_RATIO:g}) | again ÷ alone "
            f"| s to {RECOVERY_LEVEL:g}× alone (≤ {RECOVERY_LIMIT_S:g}) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for h in ratios:
            recovered = "never" if h.recovery_s is None else f"{h.recovery_s:.1f}"
            lines.append(
                f"| {h.label} | {h.arrivals} | {h.hog} | {h.output_tokens_per_s_alone:.1f} / "
                f"{h.output_tokens_per_s_beside:.1f} / {h.output_tokens_per_s_again:.1f} | "
                f"{_held(h.throughput_ratio, h.throughput_target_met)} | {h.itl_p99_ratio:.2f} | "
                f"{_held(h.ttft_p99_ratio, h.ttft_target_met)} | {h.again_over_alone:.2f} | "
                f"{_held(recovered, h.recovery_target_met)} |"
            )
    return "\n".join(lines)


def _held(figure: float | str, met: bool) -> str:
    """A figure with its target: bold where the target is missed."""
    text = f"{figure:.2f}" if isinstance(figure, float) else figure
    return text if met else f"**{text}** (missed)"


def main() -> None:
    parser = served_model_parser(__doc__)
    parser.add_argument("-c", "--concurrency", type=int, action="append", help="repeatable; default 16")
    parser.add_argument("--vllm-python", default=None, help="the python of a venv with vllm-cpu")
    parser.add_argument("--mix", default="distinct")
    add_workload_arguments(parser)
    parser.add_argument(
        "--hog",
        type=int,
        default=0,
        help="also run each load beside N busy single-threaded processes, then alone again",
    )
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
    ratios: list[HogRatios] = []
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
            server_reports, server_ratios = _run(server, workload, concurrencies, slo, args.hog)
            lines: list[TrafficReport | HogRatios] = [*server_reports, *server_ratios]
            for line in lines:
                sys.stdout.write(json.dumps(asdict(line)) + "\n")
            sys.stdout.flush()
            reports.extend(server_reports)
            ratios.extend(server_ratios)
    sys.stdout.write(markdown(reports, ratios) + "\n")


if __name__ == "__main__":
    main()
