"""The router-overhead benchmark: direct traffic spread over the replicas, and its ratios."""

from __future__ import annotations

import asyncio

from benchmarks.router_overhead import overhead
from benchmarks.traffic import TrafficReport, Workload, run_traffic
from tests.bench.fake_chat import fake_chat_server, fake_run

_WORKLOAD = Workload("distinct", input_len=8, input_range=2, output_len=3, output_range=1, shared_len=0, seed=5)


def test_direct_traffic_over_several_replicas_keeps_each_one_busy() -> None:
    async def scenario() -> tuple[list[int], list[int], int]:
        first: list[int] = []
        second: list[int] = []
        servers = [await fake_chat_server(first, 3), await fake_chat_server(second, 3)]
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
        return fake_run(
            label,
            _WORKLOAD,
            "closed C=4",
            requests=2,
            tokens=10,
            ttft_s=ttft_s,
            gap_s=gap_s,
            prompt_tokens=20,
            wall_s=wall_s,
        )

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
