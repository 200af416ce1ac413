"""A stopped tritonserver (SIGSTOP) through the real server: fast 503s, two log lines, and back.

A stopped server accepts the frontend's connections and never answers, so only the frontend's
probe deadline can tell (``openai_frontend/client/health.py``). This test stops a tritonserver of
its own (by its PID, never the session's shared one: other tests keep using that), sends 50
requests, each of which must get its 503 ``backend_unavailable`` with ``Retry-After`` within
the probes that declare it down and a margin (they used to hang ~39 s, or to the end-to-end timeout), then
resumes it and waits for service to come back. The frontend's log must say it once each way.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openai_frontend.client.health import MISSES_TO_DOWN
from openai_frontend.launcher.model_repo import MODEL_NAME
from openai_frontend.launcher.tritonserver import TritonServerProcess
from tests.e2e.conftest import _run_frontend, _stop_frontends, e2e_settings, serving
from tests.e2e.processes import post_until_ok

SERVED = "tiny-outage"
PROBE_S = 0.5
# A probe in flight when the server stopped answers; the next MISSES_TO_DOWN go unanswered for
# PROBE_S each. The margin is for a busy machine; without the probe a request waited until its deadline.
BOUND_S = (MISSES_TO_DOWN + 1) * PROBE_S + 3.0
REQUESTS = 50
RESUME_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def own_triton(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServerProcess]:
    with serving(
        e2e_settings(tiny_model_dir, SERVED, max_iter_times=64), tmp_path_factory.mktemp("triton-outage")
    ) as handle:
        yield handle.process


def _backend_metrics(http: httpx.Client) -> dict[str, float]:
    families = text_string_to_metric_families(http.get("/metrics").text)
    return {s.name: s.value for f in families for s in f.samples if s.name in ("backend_up", "backend_outages_total")}


def _request(url: str, index: int) -> tuple[float, httpx.Response]:
    """One of four kinds, by ``index``: chat or completions, streamed or not; (seconds, reply)."""
    body: dict[str, Any] = {"model": SERVED, "max_tokens": 2, "stream": index % 4 >= 2}
    if index % 2 == 0:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": "hi"}]
    else:
        path, body["prompt"] = "/v1/completions", "Once upon"
    started = time.monotonic()
    reply = httpx.post(f"{url}{path}", json=body, timeout=BOUND_S + 5.0)
    return time.monotonic() - started, reply


def test_a_stopped_tritonserver_gets_fast_503s_one_warning_each_way_and_service_resumes(
    own_triton: TritonServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    pid = own_triton.pid
    assert pid is not None
    values: dict[str, Any] = {
        "triton_grpc_url": own_triton.endpoints.grpc_url,
        "triton_model_name": MODEL_NAME,
        "served_model_name": SERVED,
        "backend_probe_interval_s": PROBE_S,
    }
    frontend = _run_frontend(values)
    chat = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        with httpx.Client(base_url=frontend.url, timeout=30) as http:
            # Warm, the response channel open: streams in flight wait on it, the others on their own call.
            assert http.post("/v1/chat/completions", json=chat).status_code == 200
            assert http.post("/v1/chat/completions", json={**chat, "stream": True}).status_code == 200
            assert _backend_metrics(http) == {"backend_up": 1.0, "backend_outages_total": 0.0}
            caplog.set_level(logging.WARNING)
            caplog.clear()
            os.kill(pid, signal.SIGSTOP)
            try:
                with ThreadPoolExecutor(max_workers=10) as pool:
                    results = list(pool.map(lambda i: _request(frontend.url, i), range(REQUESTS)))
                ready = http.get("/health/ready")
                live = http.get("/health")
                down = _backend_metrics(http)
            finally:
                os.kill(pid, signal.SIGCONT)
            resumed = post_until_ok(http, "/v1/chat/completions", chat, RESUME_TIMEOUT_S, 0.1)
            up = _backend_metrics(http)
            ready_again = http.get("/health/ready")
    finally:
        _stop_frontends([frontend])
    for seconds, reply in results:
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "backend_unavailable" and reply.headers["retry-after"]
        assert seconds < BOUND_S, f"a 503 took {seconds:.1f} s"
    assert ready.status_code == 503 and live.status_code == 200
    assert down == {"backend_up": 0.0, "backend_outages_total": 1.0}
    assert resumed is not None and resumed.json()["usage"]["completion_tokens"] == 2
    assert up == {"backend_up": 1.0, "backend_outages_total": 1.0} and ready_again.status_code == 200
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("openai_frontend")]
    assert len(ours) <= 3, ours  # not one a request: two state changes, and at most one other line
    assert len([m for m in ours if m.startswith("tritonserver is not answering")]) == 1, ours
    assert len([m for m in ours if m.startswith("tritonserver answers again")]) == 1, ours
