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

import httpx

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper."


@dataclass
class RequestResult:
    ok: bool
    tokens: int = 0
    ttft_s: float = 0.0
    itl_s: float = 0.0  # mean gap between content chunks
    error: str = ""


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


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)
    return ordered[index]


async def one_request(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> RequestResult:
    started = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return RequestResult(False, error=f"HTTP {response.status_code}: {text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens"):
                    tokens = int(usage["completion_tokens"])
                for choice in chunk.get("choices", []):
                    if (choice.get("delta") or {}).get("content"):
                        stamps.append(time.perf_counter())
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return RequestResult(False, error=f"{type(exc).__name__}: {exc}")
    if not stamps:
        return RequestResult(False, error="no content chunks")
    gaps = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    return RequestResult(
        True,
        tokens=tokens or len(stamps),
        ttft_s=stamps[0] - started,
        itl_s=statistics.mean(gaps) if gaps else 0.0,
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
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        warm = await one_request(client, url, body)  # not timed: first-request costs
        if not warm.ok and force_length and "HTTP 4" in warm.error:
            body.pop("ignore_eos")
            body.pop("min_tokens")
        semaphore = asyncio.Semaphore(concurrency)

        async def bounded() -> RequestResult:
            async with semaphore:
                return await one_request(client, url, body)

        started = time.perf_counter()
        results = await asyncio.wait_for(asyncio.gather(*(bounded() for _ in range(requests))), deadline_s)
        wall = time.perf_counter() - started
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
        ttft_p50_ms=round(_percentile([r.ttft_s for r in good], 0.5) * 1e3, 1),
        ttft_p95_ms=round(_percentile([r.ttft_s for r in good], 0.95) * 1e3, 1),
        itl_p50_ms=round(_percentile([r.itl_s for r in good], 0.5) * 1e3, 2),
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
        )
    )
    sys.stdout.write(json.dumps(asdict(report)) + "\n")


if __name__ == "__main__":
    main()
