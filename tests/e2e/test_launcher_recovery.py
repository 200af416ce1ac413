"""Crash and hang recovery through the launcher: the model's process (the Python-backend stub) dies or hangs,
the stream in flight ends with an error event, readiness and new requests answer 503 at once, and
the launcher's supervisor restarts tritonserver, after which the model answers again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx

from openai_frontend.launcher import supervisor
from openai_frontend.launcher.tritonserver import SHM_DIR, STUB_NAME
from tests.e2e.processes import group_pids
from tests.e2e.test_smoke import _finish, _read_until, _start_launcher, _triton_pid


def _stub_of(triton_pid: int) -> tuple[int, list[str]]:
    """The stub's pid and its shared-memory region (named on its command line)."""
    for pid in group_pids(triton_pid):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        if Path(args[0]).name == STUB_NAME:
            return pid, [a for a in args if a.startswith("triton_python_backend_shm_region_")]
    raise AssertionError("no stub process found")


def test_a_killed_model_process_is_restarted_and_the_stream_in_flight_ends(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    launcher, port = _start_launcher(tiny_model_dir, tmp_path, "--max-iter-times", "30000", "--max-seq-len", "32768")
    lines: list[str] = []
    base = f"http://127.0.0.1:{port}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30000, "ignore_eos": True}
    events: list[str] = []
    started, ended = threading.Event(), threading.Event()

    def stream() -> None:
        with (
            httpx.Client(base_url=base, timeout=60) as http,
            http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply,
        ):
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    started.set()
        ended.set()

    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        stub, regions = _stub_of(_triton_pid(lines))
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert started.wait(60)
        os.kill(stub, signal.SIGKILL)
        killed = time.monotonic()
        assert ended.wait(10)
        stream_ended_after = time.monotonic() - killed
        with httpx.Client(base_url=base, timeout=30) as http:
            ready = http.get("/health/ready")
            refused = http.post("/v1/chat/completions", json={**body, "max_tokens": 2})
            refused_after = time.monotonic() - killed
            answered = None
            deadline = time.monotonic() + 120  # the tiny model loads in seconds
            while time.monotonic() < deadline:
                reply = http.post("/v1/chat/completions", json={**body, "max_tokens": 2})
                if reply.status_code == 200:
                    answered = reply
                    break
                time.sleep(0.25)
        _read_until(launcher, "the model is ready again", lines, timeout=30)
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    output = "".join(lines)
    # The stream was cut short: the error event, then [DONE], within 2 s of the kill.
    assert events[-1] == "[DONE]" and json.loads(events[-2])["err_msg"] == "model backend unavailable"
    assert stream_ended_after < 2.0
    # Meanwhile: not ready, and a plain 503 with Retry-After (never Triton's "not healthy" text).
    assert ready.status_code == 503
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "backend_unavailable" and refused_after < 3.0
    assert answered is not None and answered.json()["usage"]["completion_tokens"] == 2
    assert f"the model's process (pid {stub}) died; restarting tritonserver" in output, output
    assert not [r for r in regions if (SHM_DIR / r).exists()]  # the dead stub's shared memory is gone
    assert code == 0, output
    assert "tritonserver stopped (status 0)" in output, output


def test_a_hung_model_process_fails_readiness_at_once_and_is_restarted(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The hung variant: the stub exists but never answers (SIGSTOP). Triton still calls the model
    READY; our readiness probe is an inference the model must answer, so it fails within its
    timeout, and the supervisor restarts the server once the probe has failed for HANG_RESTART_S."""
    launcher, port = _start_launcher(tiny_model_dir, tmp_path)
    lines: list[str] = []
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    stub = 0
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        stub, _ = _stub_of(_triton_pid(lines))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            assert http.get("/health/ready").status_code == 200
            os.kill(stub, signal.SIGSTOP)
            stopped = time.monotonic()
            while http.get("/health/ready").status_code == 200 and time.monotonic() - stopped < 15:
                time.sleep(0.1)
            unready_after = time.monotonic() - stopped
            refused = http.post("/v1/chat/completions", json=body)
            answered = None
            deadline = time.monotonic() + supervisor.HANG_RESTART_S + supervisor.PROBE_INTERVAL_S + 120
            while time.monotonic() < deadline:
                reply = http.post("/v1/chat/completions", json=body)
                if reply.status_code == 200:
                    answered = reply
                    break
                time.sleep(0.5)
            restarted_after = time.monotonic() - stopped
        _read_until(launcher, "the model is ready again", lines, timeout=30)
    finally:
        if stub:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stub, signal.SIGCONT)  # so that a failed test leaves nothing stopped
        code = _finish(launcher, signal.SIGINT, lines)
    output = "".join(lines)
    assert unready_after < 5.0  # within the probe timeout
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "backend_unavailable"
    assert answered is not None and answered.json()["usage"]["completion_tokens"] == 2
    assert restarted_after >= supervisor.HANG_RESTART_S
    assert "the model has not answered its health probe for" in output, output
    assert code == 0, output


def test_a_segfault_of_the_model_process_is_answered_within_2_s(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A stub that dies of SIGSEGV dies at once (no native backtrace to symbolize first), so its
    stream ends and a new request gets its 503 within 2 s; with --api-key, the restarted server
    still takes the frontend's calls (over the same private sockets)."""
    launcher, port = _start_launcher(
        tiny_model_dir, tmp_path, "--max-iter-times", "30000", "--max-seq-len", "32768", "--api-key", "k1"
    )
    lines: list[str] = []
    auth = {"Authorization": "Bearer k1"}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30000, "ignore_eos": True}
    events: list[str] = []
    started, ended = threading.Event(), threading.Event()

    def stream() -> None:
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers=auth) as http,
            http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply,
        ):
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    started.set()
        ended.set()

    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        stub, _ = _stub_of(_triton_pid(lines))
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert started.wait(60)
        os.kill(stub, signal.SIGSEGV)
        crashed = time.monotonic()
        assert ended.wait(10)
        stream_ended_after = time.monotonic() - crashed
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers=auth) as http:
            refused = http.post("/v1/chat/completions", json={**body, "max_tokens": 2})
            refused_after = time.monotonic() - crashed
            assert stream_ended_after < 2.0, stream_ended_after
            assert refused.status_code == 503 and refused_after < 2.0, (refused.status_code, refused_after)
            answered = None
            deadline = time.monotonic() + 300  # a loaded machine reloads the model slowly
            while time.monotonic() < deadline:
                try:
                    reply = http.post("/v1/chat/completions", json={**body, "max_tokens": 2})
                except httpx.TimeoutException:
                    continue  # on a loaded machine the reload can outlast one request's timeout
                if reply.status_code == 200:
                    answered = reply
                    break
                time.sleep(0.25)
        _read_until(launcher, "the model is ready again", lines, timeout=30)
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    output = "".join(lines)
    assert events[-1] == "[DONE]" and json.loads(events[-2])["err_msg"] == "model backend unavailable"
    assert answered is not None and answered.json()["usage"]["completion_tokens"] == 2
    assert f"the model's process (pid {stub}) died; restarting tritonserver" in output, output
    assert code == 0, output
