"""``lora_requests_info`` on /metrics: the adapters with requests waiting for their first output
and those running, as vLLM serves it and the Gateway API Inference Extension's picker reads it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import httpx
from frontend_fakes import MODEL, FakeBackend, backend_error, chat_body, default_script, settings
from prometheus_client.parser import text_string_to_metric_families

from openai_frontend.app import create_app
from openai_frontend.client.base import BackendError, BackendRequest
from python_backend.protocol.contract import ChoiceDelta

ADAPTER = "tiny-lora"  # frontend_fakes' settings serve it
INFO = "vllm:lora_requests_info"


@dataclass
class GatedBackend(FakeBackend):
    """Holds each request before its first output and again before the rest, until told."""

    first: asyncio.Event = field(default_factory=asyncio.Event)
    first_taken: asyncio.Event = field(default_factory=asyncio.Event)
    rest: asyncio.Event = field(default_factory=asyncio.Event)

    async def _generate(self, req: BackendRequest) -> AsyncGenerator[ChoiceDelta, None]:
        self.requests.append(req)
        self.started.set()
        items = self.script(req)
        await self.first.wait()
        for index, item in enumerate(items):
            if isinstance(item, BackendError):
                raise item
            yield item
            if index == 0:  # the frontend asks for more only once it has handled the first
                self.first_taken.set()
                await self.rest.wait()


async def lora_info(client: httpx.AsyncClient) -> list[Any]:
    """The family's series as (labels, value)."""
    text = (await client.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    family = families.get(INFO)
    return [] if family is None else [(s.labels, s.value) for s in family.samples]


def _client(backend: FakeBackend, **overrides: Any) -> httpx.AsyncClient:
    app = create_app(settings(metrics_vllm_names=True, **overrides), backend)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


def _labels(waiting: str, running: str) -> dict[str, str]:
    return {"max_lora": "1", "waiting_lora_adapters": waiting, "running_lora_adapters": running}


async def test_an_adapters_request_waits_then_runs_then_leaves() -> None:
    backend = GatedBackend()
    async with _client(backend) as client:
        before = time.time()
        [(labels, stamp)] = await lora_info(client)
        assert labels == _labels("", "") and before <= stamp <= time.time()
        answer = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body(model=ADAPTER)))
        await asyncio.wait_for(backend.started.wait(), 10)
        [(labels, stamp)] = await lora_info(client)
        assert labels == _labels(ADAPTER, "")
        assert stamp >= before  # the reading's time: a reader keeping several series takes the newest
        backend.first.set()
        await asyncio.wait_for(backend.first_taken.wait(), 10)
        assert [labels for labels, _ in await lora_info(client)] == [_labels("", ADAPTER)]
        backend.rest.set()
        assert (await asyncio.wait_for(answer, 10)).status_code == 200
        assert [labels for labels, _ in await lora_info(client)] == [_labels("", "")]


async def test_the_base_model_is_no_adapter() -> None:
    backend = GatedBackend()
    async with _client(backend) as client:
        answer = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body(model=MODEL)))
        await asyncio.wait_for(backend.started.wait(), 10)
        assert [labels for labels, _ in await lora_info(client)] == [_labels("", "")]
        backend.first.set()
        backend.rest.set()
        assert (await asyncio.wait_for(answer, 10)).status_code == 200


async def test_a_failed_request_leaves_no_trace() -> None:
    backend = FakeBackend(script=lambda req: [backend_error(503, "down", "backend_unavailable")])
    async with _client(backend) as client:
        for stream in (False, True):
            reply = await client.post("/v1/chat/completions", json=chat_body(model=ADAPTER, stream=stream))
            assert reply.status_code in (200, 503)
        assert [labels for labels, _ in await lora_info(client)] == [_labels("", "")]


async def test_completions_count_too() -> None:
    backend = GatedBackend(script=default_script)
    async with _client(backend) as client:
        body = {"model": ADAPTER, "prompt": "Hi", "max_tokens": 4}
        answer = asyncio.create_task(client.post("/v1/completions", json=body))
        await asyncio.wait_for(backend.started.wait(), 10)
        assert [labels for labels, _ in await lora_info(client)] == [_labels(ADAPTER, "")]
        backend.first.set()
        backend.rest.set()
        assert (await asyncio.wait_for(answer, 10)).status_code == 200


async def test_without_adapters_there_is_no_family_as_in_vllm() -> None:
    async with _client(FakeBackend(), lora_names=[]) as client:
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200
        assert await lora_info(client) == []
