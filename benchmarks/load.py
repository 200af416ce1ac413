"""Load generator for any OpenAI-compatible chat endpoint (ours, vLLM, transformers serve).

Sends R streaming chat requests with at most C in flight and prints one JSON line: aggregate
tokens/s, TTFT p50/p95, inter-token latency p50, errors. Every request is bounded by a timeout
and the whole timed phase by a deadline.

    python benchmarks/load.py --base-url http://127.0.0.1:8000/v1 --model NAME -c 16 -n 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

from benchmarks.http_stream import HttpError, StreamingConnection

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper."


@dataclass
class RequestResult:
    ok: bool
    tokens: int = 0
    ttft_s: float = 0.0
    itl_s: float = 0.0  # mean gap between content chunks
    error: str = ""
    gaps_s: list[float] = field(default_factory=list)  # every gap between content chunks
    prompt_tokens: int = 0


@dataclass
class LoadReport:
    label: str
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    tokens: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    error_samples: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)
    return ordered[index]


async def one_request(connection: StreamingConnection, body: dict[str, object], timeout_s: float) -> RequestResult:
    started = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    prompt_tokens = 0

    async def consume() -> None:
        nonlocal tokens, prompt_tokens
        async for line in connection.post_lines(body):
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage")
            if usage and usage.get("completion_tokens"):
                tokens = int(usage["completion_tokens"])
                prompt_tokens = int(usage.get("prompt_tokens") or 0)
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    stamps.append(time.perf_counter())

    try:
        await asyncio.wait_for(consume(), timeout_s)
    except (HttpError, OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
        await connection.close()  # whatever is left of that response must not reach the next one
        return RequestResult(False, error=f"{type(exc).__name__}: {exc}")
    if not stamps:
        return RequestResult(False, error="no content chunks")
    gaps = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    return RequestResult(
        True,
        tokens=tokens or len(stamps),
        ttft_s=stamps[0] - started,
        itl_s=statistics.mean(gaps) if gaps else 0.0,
        gaps_s=gaps,
        prompt_tokens=prompt_tokens,
    )


async def run_load(
    base_url: str,
    model: str,
    concurrency: int,
    requests: int,
    max_tokens: int,
    prompt: str,
    label: str,
    timeout_s: float = 300.0,
    deadline_s: float = 900.0,
    force_length: bool = True,
    api_key: str | None = None,
) -> LoadReport:
    url = base_url.rstrip("/") + "/chat/completions"
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        # Token counts from the server's usage, not from content chunks: a token whose text is
        # empty (special, or part of a character) sends no content, so chunks undercount.
        "stream_options": {"include_usage": True},
    }
    if force_length:
        body.update({"ignore_eos": True, "min_tokens": max_tokens})
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # One keep-alive connection per concurrent stream, as a pool of clients would hold.
    connections = [StreamingConnection(url, headers) for _ in range(concurrency)]
    try:
        warm = await one_request(connections[0], body, timeout_s)  # not timed: first-request costs
        if not warm.ok and force_length and "HTTP 4" in warm.error:
            body.pop("ignore_eos")
            body.pop("min_tokens")
        remaining = list(range(requests))
        results: list[RequestResult] = []

        async def worker(connection: StreamingConnection) -> None:
            while remaining:
                remaining.pop()
                results.append(await one_request(connection, body, timeout_s))

        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker(c) for c in connections)), deadline_s)
        wall = time.perf_counter() - started
    finally:
        for connection in connections:
            await connection.close()
    good = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in good)
    return LoadReport(
        label=label,
        concurrency=concurrency,
        requests=requests,
        errors=len(results) - len(good),
        wall_s=round(wall, 3),
        tokens=tokens,
        tokens_per_s=round(tokens / wall, 2) if wall > 0 else 0.0,
        ttft_p50_ms=round(percentile([r.ttft_s for r in good], 0.5) * 1e3, 1),
        ttft_p95_ms=round(percentile([r.ttft_s for r in good], 0.95) * 1e3, 1),
        itl_p50_ms=round(percentile([r.itl_s for r in good], 0.5) * 1e3, 2),
        error_samples=[r.error for r in results if not r.ok][:3],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("-n", "--requests", type=int, default=0, help="default max(8, 2*C)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--label", default="server")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--deadline", type=float, default=900.0)
    parser.add_argument("--no-force-length", action="store_true", help="do not send ignore_eos/min_tokens")
    parser.add_argument("--api-key", default=None, help="sent as a Bearer token")
    args = parser.parse_args()
    report = asyncio.run(
        run_load(
            args.base_url,
            args.model,
            args.concurrency,
            args.requests or max(8, 2 * args.concurrency),
            args.max_tokens,
            args.prompt,
            args.label,
            args.timeout,
            args.deadline,
            not args.no_force_length,
            args.api_key,
        )
    )
    sys.stdout.write(json.dumps(asdict(report)) + "\n")


if __name__ == "__main__":
    main()
