"""The /metrics of the frontend and of Triton through the real tritonserver: what they publish."""

from __future__ import annotations

import os
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import TritonHandle
from tests.e2e.test_chat_e2e import QUESTION


def _samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_count_what_the_model_answered(
    triton_server: TritonHandle, frontend_factory: Callable[..., str]
) -> None:
    url = frontend_factory()  # a frontend of its own: its counters start at 0
    name = triton_server.served_model_name
    body = {"model": name, "messages": QUESTION, "max_tokens": 5, "ignore_eos": True}
    with httpx.Client(timeout=60) as http:
        answer = http.post(f"{url}/v1/chat/completions", json=body).json()
        with http.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as reply:
            chunks = [line for line in reply.iter_lines() if line.startswith("data: {")]
    assert chunks and answer["usage"]["completion_tokens"] == 5
    samples = _samples(url)
    model = frozenset({("model_name", name)})

    def value(metric: str, **labels: str) -> float:
        return samples.get((metric, model | frozenset(labels.items())), 0.0)

    assert value("request_success_total", finished_reason="length") == 2
    assert value("generation_tokens_total") == 10
    assert value("prompt_tokens_total") == 2 * answer["usage"]["prompt_tokens"]
    assert value("e2e_request_latency_seconds_count") == 2
    assert value("time_to_first_token_seconds_count") == 1  # only the stream's tokens are timed
    assert value("request_queue_time_seconds_count") == 2
    assert value("num_requests_running") == 0


def test_triton_publishes_the_engines_compute_thread_count(triton_server: TritonHandle) -> None:
    text = triton_server.process.read_metrics()
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "triton_chat_compute_threads"
    ]
    # One engine, whose team has at least one thread and at most one per CPU of the machine.
    assert len(values) == 1 and 1 <= values[0] <= (os.cpu_count() or 1)
