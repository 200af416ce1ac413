"""Fakes the benchmark tests share: a streaming chat server on loopback, and a finished run's report.

``fake_chat_server`` answers what ``run_traffic`` sends without a model; ``fake_run`` is the
``TrafficReport`` of a run whose requests all succeeded with the figures given, for the code that
compares runs. Imports the benchmarks' own modules only.
"""

from __future__ import annotations

import asyncio
import json

from benchmarks.load import RequestResult
from benchmarks.traffic import TrafficReport, Workload, summarize


async def fake_chat_server(posts: list[int], completion_tokens: int) -> asyncio.Server:
    """A keep-alive HTTP server on 127.0.0.1 (a free port) that answers every POST with three
    content chunks and a usage of ``completion_tokens`` output tokens, appending 1 to ``posts``
    for each POST."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionResetError):  # the client closed: the run is over
                break
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            posts.append(1)
            chunks: list[dict[str, object]] = [{"choices": [{"delta": {"content": "x"}}]}] * 3
            chunks.append({"choices": [], "usage": {"completion_tokens": completion_tokens, "prompt_tokens": 9}})
            body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def fake_run(
    label: str,
    workload: Workload,
    arrivals: str,
    *,
    requests: int,
    tokens: int,
    ttft_s: float,
    gap_s: float,
    prompt_tokens: int,
    wall_s: float,
) -> TrafficReport:
    """The report of ``requests`` requests that all succeeded in ``wall_s``: each ``tokens`` output
    tokens, its first after ``ttft_s`` and nine gaps of ``gap_s``, summarized as ``run_traffic``
    summarizes (SLO: TTFT 1 s, ITL p99 100 ms)."""
    ok = RequestResult(True, tokens=tokens, ttft_s=ttft_s, gaps_s=[gap_s] * 9, prompt_tokens=prompt_tokens)
    return summarize(label, workload, arrivals, [ok] * requests, wall_s, 1.0, 0.1)
