"""The response path under churn, through the frontend and the real tritonserver: many short
streams that end, are cancelled by their clients or fail in the model, while the frontend's
response channel rotates (here every ``ROTATE_EVERY`` channel responses). The model's process must not crash:
its pid stays the same, every request gets its answer, and the model answers its probe after."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from openai_frontend.client import channel as channel_module
from tests.e2e.conftest import TritonHandle

pytestmark = pytest.mark.e2e

REQUESTS = 240
CONCURRENCY = 16
ROTATE_EVERY = 10  # channel responses (one per engine pass) before the frontend opens a new one
TIME_LIMIT_S = 240.0
BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}


async def _one(http: httpx.AsyncClient, kind: str, rng: random.Random, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": f"hi {rng.random()}"}], "stream": True}
    if kind == "error":
        body["response_format"] = BAD_SCHEMA  # refused by the model, on the preparer's thread
    else:
        body["max_tokens"] = rng.randint(1, 6)
    async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            await reply.aread()
            return f"http {reply.status_code}"
        async for line in reply.aiter_lines():
            if kind == "cancel" and line.startswith("data: {"):
                return "cancelled"  # leaving the stream closes the connection mid-answer
            if line == "data: [DONE]":
                return "done"
    return "no [DONE]"


@pytest.mark.slow
def test_short_streams_ending_cancelled_and_failing_never_crash_the_model(
    triton_server: TritonHandle, frontend_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The frontend runs in this process: its channel rotates every few passes instead of 200, so
    # that the streams ride on several channels, each closed while others open.
    monkeypatch.setattr(channel_module, "ROTATE_AFTER", ROTATE_EVERY)
    url, model = frontend_factory(), triton_server.served_model_name
    before = set(triton_server.process.model_processes())
    opened_before = _channels_opened(triton_server)
    rng = random.Random(18)
    kinds = [rng.choice(["done", "done", "cancel", "error"]) for _ in range(REQUESTS)]

    async def run() -> list[tuple[str, str]]:
        limit = asyncio.Semaphore(CONCURRENCY)
        deadline = time.monotonic() + TIME_LIMIT_S
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:

            async def guarded(kind: str) -> tuple[str, str]:
                async with limit:
                    if time.monotonic() > deadline:
                        return kind, "skipped"
                    return kind, await _one(http, kind, rng, model)

            return await asyncio.gather(*(guarded(kind) for kind in kinds))

    results = asyncio.run(run())
    outcomes = Counter(results)
    with httpx.Client(base_url=url, timeout=30) as http:
        ready = http.get("/health/ready")
        after = http.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 2},
        )
    assert set(triton_server.process.model_processes()) == before, "the model's process was replaced"
    assert ready.status_code == 200 and after.status_code == 200, (ready.text, after.text)
    answered = [(kind, outcome) for kind, outcome in results if outcome != "skipped"]
    assert len(answered) * 2 >= REQUESTS, outcomes  # most ran within the time limit
    expected = {"done": "done", "cancel": "cancelled", "error": "http 400"}
    wrong = [(kind, outcome) for kind, outcome in answered if outcome != expected[kind]]
    assert not wrong, (wrong[:5], outcomes)
    # The frontend's channel rotated under the traffic: more than one was opened for it.
    assert _channels_opened(triton_server) - opened_before >= 3, outcomes


def _channels_opened(triton: TritonHandle) -> int:
    log = triton.process.log_path.read_text(encoding="utf-8", errors="replace")
    return sum(1 for line in log.splitlines() if "response channel frontend-" in line and line.endswith(" open"))
