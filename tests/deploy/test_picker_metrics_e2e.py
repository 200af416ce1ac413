"""The endpoint picker's figures through a real ``triton-chat serve`` (the tiny model on CPU): with
one sequence admitted at a time and more requests sent, the queue it reads grows, the batch holds
one, the KV-cache use is a fraction above 0; once they are answered, both counts are back at 0."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_picker_metrics import picker_names, picker_reads
from tests.e2e.test_smoke import _read_until, _start_launcher

pytestmark = pytest.mark.e2e

REQUESTS = 4
WAVES = 5
TOKENS = 400
SEEN_WITHIN_S = 120.0


@pytest.fixture
def server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    flags = ("--metrics-vllm-names", "--max-num-seqs", "1", "--max-iter-times", str(TOKENS))
    launcher, port = _start_launcher(tiny_model_dir, tmp_path, *flags)
    lines: list[str] = []
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        # Its log is drained, so that its logging never blocks on a full pipe.
        threading.Thread(target=lines.extend, args=(launcher.stderr,), daemon=True).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


def _figures(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    families: dict[str, Any] = {f.name: f for f in text_string_to_metric_families(text)}
    names = picker_names()
    return {
        key: picker_reads(families, names[key]) for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")
    }


def _ask(url: str) -> int:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS, "ignore_eos": True}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).status_code


def _watch_one_wave(server: str, deadline: float) -> tuple[dict[str, float] | None, float]:
    """Sends ``REQUESTS`` at once; returns the first figures that show one waiting beside one
    running, if any do, and the most requests any figures showed running."""
    busy, most_running = None, 0.0
    with ThreadPoolExecutor(REQUESTS) as pool:
        answers = [pool.submit(_ask, server) for _ in range(REQUESTS)]
        while busy is None and time.monotonic() < deadline and not all(a.done() for a in answers):
            figures = _figures(server)
            most_running = max(most_running, figures["runningRequestsSpec"])
            # A publication can fall between a request's arrival and its admission, or between one
            # answer and the next admission: waiting requests with none running yet.
            if figures["queuedRequestsSpec"] >= 1 and figures["runningRequestsSpec"] >= 1:
                busy = figures
            time.sleep(0.05)
        assert [a.result() for a in answers] == [200] * REQUESTS
    return busy, most_running


def test_the_queue_the_picker_reads_grows_while_requests_wait(server: str) -> None:
    assert _figures(server) == {"queuedRequestsSpec": 0, "runningRequestsSpec": 0, "kvUsageSpec": 0}
    # The gauges are published every half second, and on a fast or a starved host one wave of
    # requests can come and go between two publications: a few waves, bounded in count and time.
    deadline, busy, most_running = time.monotonic() + SEEN_WITHIN_S, None, 0.0
    for _ in range(WAVES):
        busy, wave_most = _watch_one_wave(server, deadline)
        most_running = max(most_running, wave_most)
        if busy is not None or time.monotonic() >= deadline:
            break
    assert busy is not None, "the queue never showed a request waiting beside a running one"
    assert busy["runningRequestsSpec"] == 1 and most_running == 1  # --max-num-seqs 1
    assert 0 < busy["kvUsageSpec"] <= 1
    # The model publishes its gauges every half second: wait for the last answers to show.
    deadline, idle = time.monotonic() + SEEN_WITHIN_S, _figures(server)
    while time.monotonic() < deadline and idle["runningRequestsSpec"] != 0:
        time.sleep(0.2)
        idle = _figures(server)
    assert idle["queuedRequestsSpec"] == 0 and idle["runningRequestsSpec"] == 0
