"""One comparison run: plain transformers, our engine in-process, the served path, and vLLM CPU.

Everything runs on this machine in one sitting with the same model, prompt and output length, and
the figures that matter are ratios within the run (these machines are noisy). Prints a table and
the target ratios, and writes JSON, Markdown and an SVG plot next to ``--out``.

    python -m benchmarks.compare --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --label smollm2 --vllm-python /path/to/vllm-venv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.inprocess import InProcessResult, engine_inprocess, hf_generate
from benchmarks.load import DEFAULT_PROMPT, run_load
from benchmarks.plot import bar_chart_svg
from benchmarks.servers import PeakMemory, ServedProcess, ours, vllm

CONCURRENCY = (1, 4, 16)


def _isolated(function: Callable[..., InProcessResult], *args: Any) -> InProcessResult:
    """Run one in-process measurement in a fresh interpreter.

    Each measurement gets a process of its own: torch's OpenMP teams belong to the threads that
    started them, and a team left by an earlier measurement in this process would compete with
    the next one's (docs/design.md, "Only the engine thread runs torch in parallel").
    """
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def _requests(concurrency: int) -> int:
    # Four waves at each concurrency: with two, one slow wave (a machine hiccup, a first-wave
    # prefill) moved the C=16 figure by 10-20 % between runs.
    return max(8, 4 * concurrency)


def _served(
    server: ServedProcess,
    label: str,
    max_tokens: int,
    rows: list[dict[str, Any]],
    concurrencies: tuple[int, ...] = CONCURRENCY,
) -> int:
    """Run the load at each concurrency; returns the peak RSS (bytes) of the server tree at C=16."""
    server.start()
    peak = 0
    try:
        for concurrency in concurrencies:
            with PeakMemory(server.pid) as memory:
                report = asyncio.run(
                    run_load(
                        server.base_url, "bench", concurrency, _requests(concurrency), max_tokens, DEFAULT_PROMPT, label
                    )
                )
            row = asdict(report)
            row["peak_rss_mb"] = round(memory.peak_bytes / 2**20, 1)
            row["peak_rss_by_process_mb"] = {k: round(v / 2**20, 1) for k, v in memory.by_name.items()}
            rows.append(row)
            _show(row)
            if concurrency == 16:
                peak = memory.peak_bytes
    finally:
        server.stop()
    return peak


def _show(row: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def _find(rows: list[dict[str, Any]], label: str, concurrency: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["label"] == label and r["concurrency"] == concurrency), None)


def _ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    def tps(label: str, c: int) -> float | None:
        row = _find(rows, label, c)
        return row["tokens_per_s"] if row else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    # C=1 compares whole-request tokens/s (prefill included), which is the conservative side for
    # the served path; 1000/ITL would overstate it, and with random-weight models many tokens
    # have no text, so content chunks (ITL) are sparser than tokens.
    return {
        "served_c16_over_hf_bs16 (target >= 1.0)": ratio(tps("triton-chat", 16), tps("hf-generate", 16)),
        "served_c1_over_hf_bs1 (target >= 1.0)": ratio(tps("triton-chat", 1), tps("hf-generate", 1)),
        "served_c16_over_engine_c16 (target >= 0.9)": ratio(tps("triton-chat", 16), tps("engine", 16)),
        "served_c16_over_vllm_c16 (goal > 1.0)": ratio(tps("triton-chat", 16), tps("vllm-cpu", 16)),
        # With --stream-interval N, both servers send N tokens per streamed response.
        "served_grouped_c16_over_engine_c16": ratio(tps("triton-chat-grouped", 16), tps("engine", 16)),
        "served_grouped_c16_over_vllm_grouped_c16": ratio(tps("triton-chat-grouped", 16), tps("vllm-cpu-grouped", 16)),
    }


def _markdown(label: str, rows: list[dict[str, Any]], ratios: dict[str, float | None], command: str) -> str:
    lines = [
        f"### {label}",
        "",
        f"Command: `{command}`",
        "",
        "| configuration | C / batch | requests | tokens/s | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | errors | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['concurrency']} | {r['requests']} | {r['tokens_per_s']} | {r.get('ttft_p50_ms', '')} "
            f"| {r.get('ttft_p95_ms', '')} | {r.get('itl_p50_ms', '')} | {r.get('errors', 0)} | {r.get('peak_rss_mb', '')} |"
        )
    lines += ["", "| ratio | value |", "|---|---|"]
    lines += [f"| {name} | {value if value is not None else 'n/a'} |" for name, value in ratios.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="local model folder")
    parser.add_argument("--label", required=True, help="name of this run's files")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--vllm-python", help="python of a venv with vllm-cpu (skipped when absent)")
    parser.add_argument("--out", default="benchmarks/results", help="folder for the JSON, Markdown and SVG")
    parser.add_argument("--skip", default="", help="comma list of: hf, engine, served, vllm")
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=0,
        metavar="N",
        help="also serve C=16 with N tokens per streamed response, ours and vLLM's (rows *-grouped; 0: skip)",
    )
    parser.add_argument(
        "--vllm-arg", action="append", default=[], help="an extra vLLM argument (repeatable): --vllm-arg=--block-size"
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    rows: list[dict[str, Any]] = []
    started = time.time()

    if "hf" not in skip:
        for batch in (1, 16):
            result = _isolated(hf_generate, args.model, args.dtype, batch, args.max_tokens)
            _show(row := {"label": "hf-generate", "concurrency": batch, "requests": result.requests,
                          "tokens_per_s": result.tokens_per_s, "wall_s": result.wall_s})  # fmt: skip
            rows.append(row)
    if "engine" not in skip:
        for concurrency in CONCURRENCY:
            result = _isolated(
                engine_inprocess, args.model, args.dtype, concurrency, _requests(concurrency), args.max_tokens
            )
            _show(row := {"label": "engine", "concurrency": concurrency, "requests": result.requests,
                          "tokens_per_s": result.tokens_per_s, "wall_s": result.wall_s})  # fmt: skip
            rows.append(row)
    if "served" not in skip:
        _served(
            ours(args.model, args.dtype, out / f"{args.label}-triton-chat.log"), "triton-chat", args.max_tokens, rows
        )
        # Every request sends the same prompt, so the prefix cache serves all but the first; this
        # row shows the served path recomputing every prompt, as with prompts that share nothing.
        uncached = ours(
            args.model, args.dtype, out / f"{args.label}-nocache.log", extra_args=("--no-enable-prefix-caching",)
        )
        _served(uncached, "triton-chat-no-prefix-cache", args.max_tokens, rows, concurrencies=(16,))
    grouping = ("--stream-interval", str(args.stream_interval))
    if "served" not in skip and args.stream_interval > 0:
        grouped = ours(args.model, args.dtype, out / f"{args.label}-grouped.log", extra_args=grouping)
        _served(grouped, "triton-chat-grouped", args.max_tokens, rows, concurrencies=(16,))
    if "vllm" not in skip and args.vllm_python:
        server = vllm(args.vllm_python, args.model, args.dtype, out / f"{args.label}-vllm.log", tuple(args.vllm_arg))
        _served(server, "vllm-cpu", args.max_tokens, rows)
        if args.stream_interval > 0:
            log = out / f"{args.label}-vllm-grouped.log"
            server = vllm(args.vllm_python, args.model, args.dtype, log, (*args.vllm_arg, *grouping))
            _served(server, "vllm-cpu-grouped", args.max_tokens, rows, concurrencies=(16,))

    ratios = _ratios(rows)
    command = "python -m benchmarks.compare " + " ".join(sys.argv[1:])
    summary = {"label": args.label, "model": args.model, "dtype": args.dtype, "max_tokens": args.max_tokens,
               "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), "rows": rows, "ratios": ratios,
               "command": command}  # fmt: skip
    (out / f"{args.label}.json").write_text(json.dumps(summary, indent=1))
    (out / f"{args.label}.md").write_text(_markdown(args.label, rows, ratios, command))
    (out / f"{args.label}.svg").write_text(bar_chart_svg(f"{args.label}: aggregate tokens/s", rows))
    sys.stdout.write(json.dumps({"ratios": ratios}) + "\n")


if __name__ == "__main__":
    main()
