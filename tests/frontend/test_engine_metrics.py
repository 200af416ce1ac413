"""The engine's figures on the frontend's ``/metrics``: read from Triton's metrics port, one label
scheme with the frontend's own, and vLLM's names on request."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from frontend_fakes import MODEL, FakeBackend, chat_body, settings, usage_for
from prometheus_client.parser import text_string_to_metric_families

from openai_frontend.app import create_app
from openai_frontend.http.metrics import FrontendMetrics
from openai_frontend.launcher.triton_metrics import metrics_reader
from python_backend.protocol.contract import ChoiceDelta

# What tritonserver's /metrics shows for a model with two instances (the model's custom gauges).
TRITON_METRICS = """\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="triton_chat",version="1"} 12
# HELP triton_chat_num_sequences_running Sequences in the engine's running batch
# TYPE triton_chat_num_sequences_running gauge
triton_chat_num_sequences_running{instance="triton_chat_0_0",model="tiny"} 3
triton_chat_num_sequences_running{instance="triton_chat_0_1",model="tiny"} 1
# HELP triton_chat_num_requests_waiting Requests queued for admission
# TYPE triton_chat_num_requests_waiting gauge
triton_chat_num_requests_waiting{instance="triton_chat_0_0",model="tiny"} 5
triton_chat_num_requests_waiting{instance="triton_chat_0_1",model="tiny"} 0
# HELP triton_chat_kv_cache_reserved_tokens KV-cache token slots reserved by admitted requests
# TYPE triton_chat_kv_cache_reserved_tokens gauge
triton_chat_kv_cache_reserved_tokens{instance="triton_chat_0_0",model="tiny"} 768
triton_chat_kv_cache_reserved_tokens{instance="triton_chat_0_1",model="tiny"} 0
# HELP triton_chat_kv_cache_budget_tokens KV-cache token slots the engine may reserve
# TYPE triton_chat_kv_cache_budget_tokens gauge
triton_chat_kv_cache_budget_tokens{instance="triton_chat_0_0",model="tiny"} 1024
triton_chat_kv_cache_budget_tokens{instance="triton_chat_0_1",model="tiny"} 1024
"""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def triton_metrics() -> Iterator[str]:
    """A stand-in for tritonserver's metrics port, serving ``TRITON_METRICS``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = TRITON_METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def at(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted({"model_name": MODEL, **labels}.items()))))


async def scrape(triton_metrics_url: str = "", **overrides: object) -> Samples:
    reader = metrics_reader(triton_metrics_url) if triton_metrics_url else None
    app = create_app(settings(**overrides), FakeBackend(), engine_metrics=reader)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200
        reply = await client.get("/metrics")
    assert reply.status_code == 200
    return parse(reply.text)


async def test_the_engine_gauges_appear_per_instance_with_the_frontends_label(triton_metrics: str) -> None:
    samples = await scrape(triton_metrics_url=triton_metrics)
    first, second = {"instance": "triton_chat_0_0"}, {"instance": "triton_chat_0_1"}
    assert at(samples, "engine_metrics_up") == 1
    assert (at(samples, "num_sequences_running", **first), at(samples, "num_sequences_running", **second)) == (3, 1)
    assert at(samples, "num_requests_waiting", **first) == 5
    assert at(samples, "kv_cache_usage_perc", **first) == 0.75
    assert at(samples, "kv_cache_usage_perc", **second) == 0
    # The frontend's own figures keep their names and the same label.
    assert at(samples, "num_requests_running") == 0
    assert at(samples, "request_success_total", finished_reason="stop") == 1
    # Triton's own families stay on Triton's port.
    assert not any(name.startswith("nv_") for name, _ in samples)


async def test_vllm_names_are_what_vllms_dashboards_query(triton_metrics: str) -> None:
    samples = await scrape(triton_metrics_url=triton_metrics, metrics_vllm_names=True)
    first = {"instance": "triton_chat_0_0"}
    assert at(samples, "vllm:num_requests_running", **first) == 3
    assert at(samples, "vllm:num_requests_waiting", **first) == 5
    assert at(samples, "vllm:kv_cache_usage_perc", **first) == 0.75
    assert at(samples, "vllm:gpu_cache_usage_perc", **first) == 0.75
    assert at(samples, "vllm:request_success_total", finished_reason="stop") == 1
    assert at(samples, "vllm:e2e_request_latency_seconds_count") == 1
    assert at(samples, "vllm:num_preemptions_total") == 0
    assert at(samples, "vllm:num_http_requests_running") == 0
    assert not [name for name, _ in samples if not name.startswith("vllm:")]


async def test_an_unreachable_triton_is_engine_metrics_up_0_not_a_failed_scrape() -> None:
    samples = await scrape(triton_metrics_url="http://127.0.0.1:9/metrics")
    assert at(samples, "engine_metrics_up") == 0
    assert at(samples, "request_success_total", finished_reason="stop") == 1


async def test_without_a_triton_address_there_are_no_engine_families() -> None:
    samples = await scrape()
    assert at(samples, "engine_metrics_up") is None
    assert at(samples, "num_requests_waiting") is None


def test_prefix_cache_queries_and_hits_count_prompt_tokens() -> None:
    metrics = FrontendMetrics(MODEL)
    for cached in (0, 6):
        usage = replace(usage_for(2, prompt=10), cached_tokens=cached)
        metrics.observe(0.0).on_delta(ChoiceDelta(0, "x", finish_reason="stop", usage=usage), streamed=False)
    samples = parse(metrics.render().decode())
    assert at(samples, "prefix_cache_queries_total") == 20
    assert at(samples, "prefix_cache_hits_total") == 6
