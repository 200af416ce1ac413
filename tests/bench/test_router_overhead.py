"""The router-overhead benchmark: direct traffic spread over the replicas, and its ratios."""

from __future__ import annotations

import asyncio
import json

from benchmarks.load import RequestResult
from benchmarks.router_overhead import overhead
from benchmarks.traffic import TrafficReport, Workload, run_traffic, summarize

_WORKLOAD = Workload("distinct", input_len=8, input_range=2, output_len=3, output_range=1, shared_len=0, seed=5)


async def _counting_server(counts: list[int]) -> asyncio.Server:
    """A keep-alive HTTP server that answers every POST with a short SSE stream and counts them."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            counts.append(1)
            chunks: list[dict[str, object]] = [{"choices": [{"delta": {"content": "x"}}]}] * 3
            chunks.append({"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 9}})
            body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_direct_traffic_over_several_replicas_keeps_each_one_busy() -> None:
    async def scenario() -> tuple[list[int], list[int], int]:
        first: list[int] = []
        second: list[int] = []
        servers = [await _counting_server(first), await _counting_server(second)]
        urls = [f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}/v1" for s in servers]
        try:
            report = await run_traffic(urls, "m", _WORKLOAD, requests=12, concurrency=4, timeout_s=10, deadline_s=30)
        finally:
            for server in servers:
                server.close()
        return first, second, report.errors

    first, second, errors = asyncio.run(scenario())
    assert errors == 0
    # 12 timed requests and the untimed warm-up (on the first connection, so the first replica).
    assert len(first) + len(second) == 13
    assert len(first) >= 4 and len(second) >= 4


def test_overhead_is_the_median_ratio_of_router_to_direct_over_the_rounds() -> None:
    def report(label: str, ttft_s: float, gap_s: float, wall_s: float) -> TrafficReport:
        ok = RequestResult(True, tokens=10, ttft_s=ttft_s, gaps_s=[gap_s] * 9, prompt_tokens=20)
        return summarize(label, _WORKLOAD, "closed C=4", [ok, ok], wall_s, 1.0, 0.1)

    pairs = [
        (report("direct", 0.100, 0.020, 1.0), report("router", 0.110, 0.021, 1.05)),
        (report("direct", 0.100, 0.020, 1.0), report("router", 0.300, 0.030, 2.00)),  # a noisy round
        (report("direct", 0.100, 0.020, 1.0), report("router", 0.102, 0.020, 1.01)),
    ]
    result = overhead(pairs, "round_robin", concurrency=4, replicas=2)
    assert result.ratios["ttft_p50_ms"] == 1.1  # the median round, not the noisy one
    assert result.overhead_percent["ttft_p50_ms"] == 10.0
    assert result.ratios["itl_p50_ms"] == 1.05
    assert result.ratios["output_tokens_per_s"] == 1.05  # the same tokens took 5 % longer
    assert (result.rounds, result.concurrency, result.replicas, result.errors_router) == (3, 4, 2, 0)
