"""Timeouts through the real tritonserver : the client gets the timeout error
within the timeout + 1 s, and the engine frees the request's slot (the backend saw the cancel).

A stream that stalls mid-answer is tested against a scripted backend
(tests/frontend/test_request_timeouts.py): stopping the real stub with SIGSTOP for a second can abort tritonserver
(its Python backend's inter-process locks time out), so no test here does that."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import TritonHandle
from tests.e2e.processes import start_frontend, stop, wait_for
from tests.e2e.test_chat_e2e import QUESTION, wait_for_gauge

TIMEOUT_S = 1.0
# The tiny model writes thousands of tokens a second: this many take far longer than TIMEOUT_S.
LONG = {"max_tokens": 30000, "ignore_eos": True}
RUNNING = "triton_chat_num_sequences_running"
WAITING = "triton_chat_num_requests_waiting"


def _body(triton_server: TritonHandle, **fields: Any) -> dict[str, Any]:
    return {"model": triton_server.served_model_name, "messages": QUESTION, **LONG, **fields}


def _stream_events(reply: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]


def _frontend(triton_server: TritonHandle, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """``triton-chat frontend`` as a process of its own, ready and warm. Not a thread of this
    test: the test reads thousands of events a second, and sharing its GIL delayed the frontend's
    timers. Warm: its first chat request pays one-time costs (lazy imports, the first call on the
    gRPC channel) that took seconds on a busy machine and are not what the timeouts measure."""
    process, port = start_frontend(triton_server.grpc_url, triton_server.served_model_name, *flags)
    url = f"http://127.0.0.1:{port}"
    while wait_for(process, f"{url}/health/ready").status_code != 200:
        time.sleep(0.2)
    warm = httpx.post(f"{url}/v1/chat/completions", json={**_body(triton_server), "max_tokens": 1}, timeout=60)
    assert warm.status_code == 200, warm.text
    return process, url


@pytest.mark.parametrize("stream", [False, True])
def test_end_to_end_timeout_ends_the_request_and_frees_its_slot(triton_server: TritonHandle, stream: bool) -> None:
    frontend, url = _frontend(triton_server, "--e2e-timeout", str(TIMEOUT_S))
    expected = f"the request did not finish within the end-to-end timeout ({TIMEOUT_S:g} s)"
    try:
        started = time.monotonic()
        with httpx.Client(timeout=60) as http:
            if stream:
                body = _body(triton_server, stream=True)
                with http.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
                    assert reply.status_code == 200
                    events = _stream_events(reply)
                elapsed = time.monotonic() - started
                assert events[-1] == "[DONE]"
                assert json.loads(events[-2])["err_msg"] == expected  # MindIE mode's error ending
            else:
                reply = http.post(f"{url}/v1/chat/completions", json=_body(triton_server))
                elapsed = time.monotonic() - started
                assert reply.status_code == 504
                assert reply.json()["error"]["code"] == "timeout" and reply.json()["error"]["message"] == expected
    finally:
        code = stop(frontend)
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 1.0
    assert wait_for_gauge(triton_server, lambda v: v == 0, 5) == 0  # the engine dropped it
    assert code == 0


def _gauge(triton_server: TritonHandle, name: str) -> float:
    text = triton_server.process.read_metrics()
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _wait_for(triton_server: TritonHandle, name: str, value: float, timeout: float = 5.0) -> float:
    deadline = time.monotonic() + timeout
    while (seen := _gauge(triton_server, name)) != value and time.monotonic() < deadline:
        time.sleep(0.05)
    return seen


def test_a_request_left_in_the_queue_past_the_token_timeout_gets_a_504_and_leaves_it(
    triton_server: TritonHandle,
) -> None:
    # Every slot of the running batch is taken by a long stream (through a frontend without the
    # short timeout), so the next request waits in the engine's queue and sends nothing.
    slots = triton_server.settings.max_num_seqs
    long_frontend, long_url = _frontend(triton_server)
    timed_frontend, url = _frontend(triton_server, "--token-timeout", str(TIMEOUT_S))
    held = []  # each stream's line iterator: dropping one would close its connection
    try:
        with httpx.Client(timeout=60) as http, contextlib.ExitStack() as streams:
            for _ in range(slots):
                reply = streams.enter_context(
                    http.stream("POST", f"{long_url}/v1/chat/completions", json=_body(triton_server, stream=True))
                )
                assert reply.status_code == 200
                held.append(lines := reply.iter_lines())
                while not next(lines).startswith("data: "):  # until it is running
                    pass
            assert _wait_for(triton_server, RUNNING, slots) == slots
            started = time.monotonic()
            queued = http.post(f"{url}/v1/chat/completions", json=_body(triton_server, stream=True, max_tokens=4))
            elapsed = time.monotonic() - started
            # The cancelled request leaves the queue while the batch is still full.
            assert _wait_for(triton_server, WAITING, 0) == 0
            assert _gauge(triton_server, RUNNING) == slots
    finally:
        codes = [stop(long_frontend), stop(timed_frontend)]
    assert queued.status_code == 504 and queued.json()["error"]["code"] == "token_timeout"
    assert queued.json()["error"]["message"] == f"the model sent nothing within the token timeout ({TIMEOUT_S:g} s)"
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 1.0
    assert wait_for_gauge(triton_server, lambda v: v == 0, 5) == 0  # the long streams, closed, are gone too
    assert codes == [0, 0]
