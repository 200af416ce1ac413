"""``GET /get_load``: the model requests in flight, the figure vllm-router's power_of_two reads."""

from __future__ import annotations

import asyncio

from frontend_fakes import FakeBackend, chat_body, client_for


async def test_load_counts_the_requests_in_flight_and_drops_when_they_end() -> None:
    backend = FakeBackend(pauses={0: 30.0})  # the first delta waits: the request stays in flight
    async with client_for(backend) as client:
        idle = await client.get("/get_load")
        held = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await asyncio.wait_for(backend.started.wait(), 5)
        busy = await client.get("/get_load")
        held.cancel()
        await asyncio.wait_for(backend.ended.wait(), 5)
        after = await client.get("/get_load")
    assert idle.status_code == 200 and idle.json() == {"load": 0}
    assert busy.json() == {"load": 1}
    assert after.json() == {"load": 0}


async def test_load_needs_the_key_like_every_route_but_the_probes() -> None:
    async with client_for(FakeBackend(), api_keys=["sk-1"]) as client:
        refused = await client.get("/get_load")
        allowed = await client.get("/get_load", headers={"Authorization": "Bearer sk-1"})
    assert refused.status_code == 401 and allowed.json() == {"load": 0}
