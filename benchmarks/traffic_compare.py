"""Distinct-prompt traffic against triton-chat and vLLM's CPU build, one server at a time.

Starts each server on the same model folder, runs ``benchmarks.traffic`` at each concurrency
(closed loop, 2×C requests), stops it, and prints one JSON line per run, then a Markdown table
with each figure's ratio to vLLM measured in the same sitting. Without ``--vllm-python`` only
triton-chat runs (with and without the prefix cache).

    python -m benchmarks.traffic_compare --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --vllm-python /work/peer/vllm-venv/bin/python -c 16 -c 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.servers import ServedProcess, ours, vllm
from benchmarks.traffic import TrafficReport, Workload, run_traffic


def _run(
    server: ServedProcess, workload: Workload, concurrencies: list[int], slo: tuple[float, float]
) -> list[TrafficReport]:
    server.start()
    try:
        return [
            asyncio.run(
                run_traffic(server.base_url, "bench", workload, 2 * c, c, None, server.label, 300.0, 1800.0, *slo)
            )
            for c in concurrencies
        ]
    finally:
        server.stop()


def markdown(reports: list[TrafficReport]) -> str:
    """One row per run; the output tok/s ratio against vLLM's run at the same concurrency."""
    reference = {r.arrivals: r.output_tokens_per_s for r in reports if r.label == "vllm-cpu"}
    lines = [
        "| server | arrivals | output tok/s | vs vLLM | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | goodput (req/s) | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        base = reference.get(r.arrivals)
        ratio = f"{r.output_tokens_per_s / base:.2f}" if base else "—"
        lines.append(
            f"| {r.label} | {r.arrivals} | {r.output_tokens_per_s:.1f} | {ratio} | {r.ttft_p50_ms:.0f} / "
            f"{r.ttft_p99_ms:.0f} | {r.itl_p50_ms:.1f} / {r.itl_p99_ms:.1f} | {r.goodput_rps:.2f} | {r.errors} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="local model folder")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("-c", "--concurrency", type=int, action="append", help="repeatable; default 16")
    parser.add_argument("--vllm-python", default=None, help="the python of a venv with vllm-cpu")
    parser.add_argument("--mix", default="distinct")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--input-range", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--output-range", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    concurrencies = args.concurrency or [16]
    workload = Workload(args.mix, args.input_len, args.input_range, args.output_len, args.output_range, 512, args.seed)
    slo = (1.0, 0.1)
    reports: list[TrafficReport] = []
    with tempfile.TemporaryDirectory(prefix="traffic-compare-") as logs:
        servers = [
            ours(args.model, args.dtype, Path(logs) / "ours.log"),
            replace(
                ours(
                    args.model, args.dtype, Path(logs) / "ours-nocache.log", extra_args=("--no-enable-prefix-caching",)
                ),
                label="triton-chat, prefix cache off",
            ),
        ]
        if args.vllm_python:
            servers.append(vllm(args.vllm_python, args.model, args.dtype, Path(logs) / "vllm.log"))
        for server in servers:
            for report in _run(server, workload, concurrencies, slo):
                reports.append(report)
                sys.stdout.write(json.dumps(asdict(report)) + "\n")
                sys.stdout.flush()
    sys.stdout.write(markdown(reports) + "\n")


if __name__ == "__main__":
    main()
