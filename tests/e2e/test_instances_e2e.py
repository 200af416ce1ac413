"""Two model instances behind one tritonserver (``serve --instances 2``): each its own engine,
Triton spreads the requests over them, and the frontend's /metrics shows each instance's gauges.
Also the tritonserver ports fixed by flags, printed at start, and scraped through the frontend."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from openai_frontend.launcher.network import free_port
from tests.e2e.test_smoke import _finish, _read_until, _start_launcher

STREAMS = 4
INSTANCES = ("triton_chat_0_0", "triton_chat_0_1")


def _running_by_instance(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {
        sample.labels["instance"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "num_sequences_running"
        for sample in family.samples
    }


def test_two_instances_share_the_requests_and_report_apart(tiny_model_dir: Path, tmp_path: Path) -> None:
    metrics_port = free_port()
    launcher, port = _start_launcher(
        tiny_model_dir, tmp_path, "--instances", "2", "--max-iter-times", "30000", "--max-seq-len", "32768",
        "--triton-metrics-port", str(metrics_port),
    )  # fmt: skip
    lines: list[str] = []
    base = f"http://127.0.0.1:{port}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30000, "ignore_eos": True}
    first_tokens = threading.Semaphore(0)
    stop = threading.Event()
    finished: list[bool] = []

    def stream(i: int) -> None:
        with (
            httpx.Client(base_url=base, timeout=120) as http,
            http.stream("POST", "/v1/chat/completions", json={**body, "stream": True, "seed": i}) as reply,
        ):
            seen = False
            for line in reply.iter_lines():
                if line.startswith("data: ") and not seen:
                    seen = True
                    first_tokens.release()
                if stop.is_set():
                    break  # closing the stream cancels the request in its engine
        finished.append(True)

    try:
        _read_until(launcher, f"serving 'tiny' at {base}/v1", lines)
        said = "".join(lines)
        assert "2 model instances: each stream gets its own responses" in said
        assert re.search(rf"tritonserver listens on gRPC unix:\S+/grpc:0, HTTP http\+unix://\S+/http, "
                         rf"metrics http://127\.0\.0\.1:{metrics_port}/metrics", said), said  # fmt: skip
        # The model's gauges on the fixed port: one series per instance.
        triton_text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        for instance in INSTANCES:
            assert f'triton_chat_num_sequences_running{{instance="{instance}",model="tiny"}}' in triton_text

        readers = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(STREAMS)]
        for reader in readers:
            reader.start()
        for _ in range(STREAMS):
            assert first_tokens.acquire(timeout=120)
        # Every stream is generating now; the gauges refresh every 0.5 s, so read until they add up.
        for _ in range(200):
            running = _running_by_instance(base)
            if sum(running.values()) == STREAMS:
                break
            stop.wait(0.1)
        assert sum(running.values()) == STREAMS, running
        assert sorted(running) == list(INSTANCES)
        assert all(count >= 1 for count in running.values()), f"Triton sent every stream to one instance: {running}"
        stop.set()
        for reader in readers:
            reader.join(60)
        assert len(finished) == STREAMS
    finally:
        stop.set()
        code = _finish(launcher, 15, lines)
    assert code == 0, "".join(lines)
