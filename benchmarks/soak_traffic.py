"""The soak's traffic: a fixed mix of chat requests from C workers, and what each one got back.

Owns ``TrafficMix`` (the soak's mix: of every 100 requests 5 are invalid; of the rest 60 %
stream, 30 % ask for the whole answer, 10 % stream and leave after three chunks, as a client that
disconnects), ``Tally`` (outcomes per kind, and every outcome a user would call a failure), and
``run_traffic``. Draws come from one seeded ``random.Random`` so that two runs send the same mix.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

STREAM, WHOLE, LEAVE, INVALID = "stream", "whole", "leave", "invalid"
LEAVE_AFTER_CHUNKS = 3
REQUEST_TIMEOUT_S = 120.0
PROMPTS = (
    "Tell me about lighthouses.",
    "Write a haiku about rain.",
    "What is the capital of France?",
    "List three prime numbers.",
    "Explain continuous batching in one paragraph.",
)
# Requests a user can get wrong, each with the status the API must answer (the API's validation rules:
# a clear 4xx naming the field, never a 5xx, never a lost server).
INVALID_BODIES: tuple[tuple[dict[str, Any] | bytes, int], ...] = (
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, 400),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400),  # no tool_call_id
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, 400),
    ({"messages": []}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "top_k": -5}, 400),
    (b'{"messages": [{"role": "user", "content": "x"}', 400),  # truncated JSON
)


@dataclass(frozen=True)
class TrafficMix:
    invalid: float = 0.05
    stream: float = 0.60  # of the valid requests
    whole: float = 0.30
    max_tokens: tuple[int, int] = (8, 64)

    def draw(self, rng: random.Random) -> str:
        if rng.random() < self.invalid:
            return INVALID
        roll = rng.random()
        if roll < self.stream:
            return STREAM
        return WHOLE if roll < self.stream + self.whole else LEAVE


@dataclass
class Tally:
    """What the requests got. ``unexpected`` keeps a few examples; ``failures`` counts them all."""

    sent: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)  # "kind:status" -> count
    failures: int = 0
    unexpected: list[str] = field(default_factory=list)
    completion_tokens: int = 0

    def record(self, kind: str, status: int | str) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + 1
        key = f"{kind}:{status}"
        self.statuses[key] = self.statuses.get(key, 0) + 1

    def add(self, other: Tally) -> None:
        """Count ``other``'s requests in this tally too."""
        for kind, count in other.sent.items():
            self.sent[kind] = self.sent.get(kind, 0) + count
        for key, count in other.statuses.items():
            self.statuses[key] = self.statuses.get(key, 0) + count
        self.failures += other.failures
        self.unexpected.extend(other.unexpected[: max(20 - len(self.unexpected), 0)])
        self.completion_tokens += other.completion_tokens

    def fail(self, kind: str, what: str) -> None:
        self.failures += 1
        if len(self.unexpected) < 20:
            self.unexpected.append(f"{kind}: {what}")


async def _stream(http: httpx.AsyncClient, body: dict[str, Any], leave: bool, tally: Tally) -> None:
    kind = LEAVE if leave else STREAM
    async with http.stream("POST", "/chat/completions", json={**body, "stream": True}) as reply:
        tally.record(kind, reply.status_code)
        if reply.status_code != 200:
            tally.fail(kind, f"HTTP {reply.status_code}: {(await reply.aread())[:300]!r}")
            return
        chunks = 0
        done = False
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event or "err_msg" in event:
                tally.fail(kind, f"error event: {data[:300]}")
                return
            chunks += 1
            if leave and chunks >= LEAVE_AFTER_CHUNKS:
                return  # leaving closes the connection: the server must cancel the request
        if not done:
            tally.fail(kind, "the stream ended without [DONE]")


async def _whole(http: httpx.AsyncClient, body: dict[str, Any], tally: Tally) -> None:
    reply = await http.post("/chat/completions", json=body)
    tally.record(WHOLE, reply.status_code)
    if reply.status_code != 200:
        tally.fail(WHOLE, f"HTTP {reply.status_code}: {reply.text[:300]}")
        return
    tally.completion_tokens += int(reply.json()["usage"]["completion_tokens"])


async def _invalid(http: httpx.AsyncClient, model: str, rng: random.Random, tally: Tally) -> None:
    body, expected = INVALID_BODIES[rng.randrange(len(INVALID_BODIES))]
    if isinstance(body, bytes):
        reply = await http.post("/chat/completions", content=body, headers={"content-type": "application/json"})
    else:
        reply = await http.post("/chat/completions", json={"model": model, **body})
    tally.record(INVALID, reply.status_code)
    if reply.status_code != expected or "error" not in reply.json():
        tally.fail(INVALID, f"HTTP {reply.status_code} (expected {expected}): {reply.text[:300]}")


async def run_traffic(
    base_url: str, model: str, concurrency: int, duration_s: float, seed: int = 0, mix: TrafficMix | None = None
) -> Tally:
    """Send the mix from ``concurrency`` workers until ``duration_s`` has passed; bounded per request."""
    mix = mix or TrafficMix()
    rng = random.Random(seed)
    tally = Tally()
    deadline = time.monotonic() + duration_s

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as http:
            while time.monotonic() < deadline:
                kind = mix.draw(rng)
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
                    "max_tokens": rng.randint(*mix.max_tokens),
                    "temperature": rng.choice((0.0, 0.7, 1.0)),
                }
                try:
                    if kind == INVALID:
                        await _invalid(http, model, rng, tally)
                    elif kind == WHOLE:
                        await _whole(http, body, tally)
                    else:
                        await _stream(http, body, kind == LEAVE, tally)
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    tally.record(kind, type(exc).__name__)
                    tally.fail(kind, f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally
