"""The frontend's ``/metrics``: a scripted run with known token counts gives
exactly the expected counters, histogram counts equal the requests, gauges are 0 when idle."""

from __future__ import annotations

import asyncio

import httpx
from frontend_fakes import (
    MODEL,
    PIECES,
    PROMPT_TOKENS,
    FakeBackend,
    backend_error,
    chat_body,
    client_for,
    default_script,
    settings,
)
from prometheus_client.parser import text_string_to_metric_families
from test_disconnect import leave_mid_stream

from openai_frontend.app import create_app
from openai_frontend.client.base import BackendError, BackendRequest
from openai_frontend.http.metrics import FrontendMetrics
from python_backend.protocol.contract import ChoiceDelta

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(client: httpx.AsyncClient, **headers: str) -> Samples:
    reply = await client.get("/metrics", headers=headers)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(reply.text):  # the exposition parses
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted({"model_name": MODEL, **labels}.items()))), 0.0)


def scripted(req: BackendRequest) -> list[ChoiceDelta | BackendError]:
    """The default answer, a 429 for "overload", and an error after two tokens for "break"."""
    text = req.messages[-1]["content"]
    if text == "overload":
        return [backend_error(429, "the server is overloaded", "overloaded", "service_unavailable")]
    deltas = default_script(req)
    if text == "break":
        return [*deltas[:2], backend_error(500, "engine failed", "engine_error", "server_error")]
    return list(deltas)


def ask(content: str, **fields: object) -> dict:
    return chat_body(messages=[{"role": "user", "content": content}], **fields)


async def test_a_scripted_run_gives_exact_counts() -> None:
    async with client_for(FakeBackend(script=scripted)) as client:
        for _ in range(2):
            assert (await client.post("/v1/chat/completions", json=ask("hi"))).status_code == 200
        assert (await client.post("/v1/chat/completions", json=ask("hi", stream=True))).status_code == 200
        assert (await client.post("/v1/chat/completions", json=ask("hi", n=2))).status_code == 200
        assert (await client.post("/v1/chat/completions", json=ask("hi", temperature=-1))).status_code == 400
        assert (await client.post("/v1/chat/completions", json=ask("overload"))).status_code == 429
        broken = await client.post("/v1/chat/completions", json=ask("break", stream=True))
        assert broken.status_code == 200 and "err_msg" in broken.text
        samples = await scrape(client)

    tokens = len(PIECES)
    # Choices that finished: 2 + 1 + 2 (n=2; the second choice has one token fewer).
    assert value(samples, "request_success_total", finished_reason="stop") == 5
    assert value(samples, "prompt_tokens_total") == 4 * PROMPT_TOKENS  # once per answered request
    assert value(samples, "generation_tokens_total") == 4 * tokens + (tokens - 1)
    assert value(samples, "e2e_request_latency_seconds_count") == 4
    # Only streams time their tokens: the answered one, and the broken one up to its error.
    assert value(samples, "time_to_first_token_seconds_count") == 2
    assert value(samples, "inter_token_latency_seconds_count") == (tokens - 1) + 1
    # The fakes' queue wait of a choice's first token is 5000 µs.
    assert value(samples, "request_queue_time_seconds_count") == 5
    assert value(samples, "request_queue_time_seconds_sum") == 5 * 0.005
    assert value(samples, "request_failure_total", status="400") == 1
    assert value(samples, "request_failure_total", status="429") == 1
    assert value(samples, "request_failure_total", status="500") == 1  # the stream's error event
    assert value(samples, "requests_rejected_total", reason="overloaded") == 1
    assert value(samples, "requests_cancelled_total") == 0
    assert value(samples, "num_requests_running") == 0  # idle


async def test_requests_in_flight_are_running() -> None:
    backend = FakeBackend(delay_s=0.05)
    async with client_for(backend) as client:
        pending = asyncio.create_task(client.post("/v1/chat/completions", json=ask("hi", stream=True)))
        await asyncio.wait_for(backend.started.wait(), 5)
        during = await scrape(client)
        assert (await pending).status_code == 200
        after = await scrape(client)
    assert value(during, "num_requests_running") == 1
    assert value(after, "num_requests_running") == 0


async def test_a_client_that_leaves_mid_stream_is_counted_as_cancelled() -> None:
    app = create_app(settings(), FakeBackend(delay_s=0.05))
    await leave_mid_stream(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        samples = await scrape(client)
    assert value(samples, "requests_cancelled_total") == 1
    assert value(samples, "request_success_total", finished_reason="stop") == 0
    assert value(samples, "e2e_request_latency_seconds_count") == 0
    assert value(samples, "num_requests_running") == 0


async def test_rejections_by_the_key_check_and_the_drain_are_counted() -> None:
    app = create_app(settings(api_keys=["k1"]), FakeBackend())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        assert (await client.get("/metrics")).status_code == 401  # not for anyone who can reach the port
        assert (await client.post("/v1/chat/completions", json=ask("hi"))).status_code == 401
        app.state.frontend.drain.begin(30)
        drained = await client.post("/v1/chat/completions", json=ask("hi"), headers={"Authorization": "Bearer k1"})
        assert drained.status_code == 503
        samples = await scrape(client, Authorization="Bearer k1")
    assert value(samples, "requests_rejected_total", reason="unauthorized") == 1
    assert value(samples, "requests_rejected_total", reason="draining") == 1
    assert value(samples, "request_failure_total", status="401") == 1
    assert value(samples, "request_failure_total", status="503") == 1


def test_two_apps_count_apart() -> None:
    first, second = FrontendMetrics("a"), FrontendMetrics("a")
    first.media_fetched("ok", 1000)
    first.media_fetched("media_too_large", 0)
    text = second.render().decode()
    assert "media_fetch_total{" not in text  # nothing counted in the other registry
    families = {f.name: f for f in text_string_to_metric_families(first.render().decode())}
    counts = {s.labels["result"]: s.value for s in families["media_fetch"].samples if s.name == "media_fetch_total"}
    assert counts == {"ok": 1.0, "media_too_large": 1.0}
    sizes = [s.value for s in families["media_fetch_bytes"].samples if s.name == "media_fetch_bytes_count"]
    assert sizes == [1.0]  # only successful fetches have a size


async def test_an_unexpected_500_is_counted_as_a_failure() -> None:
    def crash(_req: BackendRequest) -> list[ChoiceDelta | BackendError]:
        raise RuntimeError("bug")

    async with client_for(FakeBackend(script=crash)) as client:
        assert (await client.post("/v1/chat/completions", json=ask("hi"))).status_code == 500
        samples = await scrape(client)
    assert value(samples, "request_failure_total", status="500") == 1
    assert value(samples, "num_requests_running") == 0
