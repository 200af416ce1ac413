"""One huge prompt through the frontend and the real tritonserver: while the model's preparer
threads spend seconds on its chat template and tokens, short streams sent after it keep getting
their first token at once, and the huge one still gets its answer (a 400: too long for the tiny
model)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.conftest import TritonHandle

pytestmark = pytest.mark.e2e

HUGE_WORDS = 150_000  # about 1.2 MB of text: several seconds of the tiny tokenizer on a busy CPU
MIN_SHORT_REQUESTS = 3  # short streams that must finish while the huge prompt is prepared


async def _first_token_s(http: httpx.AsyncClient, model: str, seed: int) -> float:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"hi {seed}"}],
        "stream": True,
        "max_tokens": 2,
    }
    started = time.perf_counter()
    async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - started
    raise AssertionError("a short stream ended without a chunk")


async def _run(url: str, model: str) -> tuple[httpx.Response, float, list[float]]:
    text = " ".join(f"word{i % 977}" for i in range(HUGE_WORDS))
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        await _first_token_s(http, model, -1)  # warm-up
        started = time.perf_counter()
        huge = asyncio.ensure_future(http.post("/v1/chat/completions", json=body))
        shorts: list[float] = []
        seed = 0
        while not huge.done():  # one short stream after another, as long as the huge one lasts
            shorts.append(await _first_token_s(http, model, seed))
            seed += 1
        return await huge, time.perf_counter() - started, shorts


def test_a_huge_prompt_being_prepared_does_not_delay_the_first_token_of_others(
    triton_server: TritonHandle, frontend_factory: Callable[..., str]
) -> None:
    url, model = frontend_factory(), triton_server.served_model_name
    before = set(triton_server.process.model_processes())
    reply, huge_s, shorts = asyncio.run(_run(url, model))
    assert set(triton_server.process.model_processes()) == before, "the model's process was replaced"
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded", reply.text
    # One preparer thread would hold every short stream sent meanwhile until the huge prompt's
    # tokens were ready: the one that waited longest would wait for most of it.
    assert len(shorts) >= MIN_SHORT_REQUESTS, (huge_s, shorts)
    assert max(shorts) < huge_s / 2, (huge_s, shorts)
