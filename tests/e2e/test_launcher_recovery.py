"""Crash and hang recovery through the launcher: the model's process (the Python-backend stub) dies or hangs,
the stream in flight ends with an error event, readiness and new requests answer 503 at once, and
the launcher's supervisor restarts tritonserver, after which the model answers again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from openai_frontend.launcher import supervisor
from openai_frontend.launcher.tritonserver import SHM_DIR, STUB_NAME
from tests.e2e.processes import group_pids, post_until_ok
from tests.e2e.test_smoke import _finish, _read_until, _start_launcher, _triton_pid


def _stub_of(triton_pid: int) -> tuple[int, list[str]]:
    """The stub's pid and its shared-memory region (named on its command line)."""
    for pid in group_pids(triton_pid):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        if Path(args[0]).name == STUB_NAME:
            return pid, [a for a in args if a.startswith("triton_python_backend_shm_region_")]
    raise AssertionError("no stub process found")


@dataclass
class _Stream:
    """A streamed chat request read in a thread: its data events, when it started and ended."""

    base: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    def read(self) -> None:
        with (
            httpx.Client(base_url=self.base, timeout=60, headers=self.headers) as http,
            http.stream("POST", "/v1/chat/completions", json={**self.body, "stream": True}) as reply,
        ):
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line.removeprefix("data: "))
                    self.started.set()
        self.ended.set()


def _kill_mid_stream(
    launcher: subprocess.Popen[str], port: int, lines: list[str], stream: _Stream, sig: int
) -> tuple[int, list[str], float, float]:
    """Once serving, start ``stream`` and send ``sig`` to the model's process while it streams;
    (the stub's pid, its shared-memory regions, when the signal went, seconds until the stream
    ended)."""
    _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
    stub, regions = _stub_of(_triton_pid(lines))
    threading.Thread(target=stream.read, daemon=True).start()
    assert stream.started.wait(60)
    os.kill(stub, sig)
    sent = time.monotonic()
    assert stream.ended.wait(10)
    return stub, regions, sent, time.monotonic() - sent


def _assert_cut_short(events: list[str]) -> None:
    """The stream ended with the backend's error event, then [DONE]."""
    assert events[-1] == "[DONE]" and json.loads(events[-2])["err_msg"] == "model backend unavailable", events[-2:]


def _answered_again(
    launcher: subprocess.Popen[str],
    lines: list[str],
    http: httpx.Client,
    body: dict[str, Any],
    timeout: float,
    pause: float,
) -> httpx.Response | None:
    """The first 200 once the restarted model answers; the launcher then says it is ready again."""
    answered = post_until_ok(http, "/v1/chat/completions", body, timeout, pause)
    _read_until(launcher, "the model is ready again", lines, timeout=30)
    return answered


def test_a_killed_model_process_is_restarted_and_the_stream_in_flight_ends(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    launcher, port = _start_launcher(tiny_model_dir, tmp_path, "--max-iter-times", "30000", "--max-seq-len", "32768")
    lines: list[str] = []
    base = f"http://127.0.0.1:{port}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30000, "ignore_eos": True}
    stream = _Stream(base, body)
    try:
        stub, regions, killed, stream_ended_after = _kill_mid_stream(launcher, port, lines, stream, signal.SIGKILL)
        with httpx.Client(base_url=base, timeout=30) as http:
            ready = http.get("/health/ready")
            refused = http.post("/v1/chat/completions", json={**body, "max_tokens": 2})
            refused_after = time.monotonic() - killed
            # The tiny model loads in seconds.
            answered = _answered_again(launcher, lines, http, {**body, "max_tokens": 2}, 120, 0.25)
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    output = "".join(lines)
    # The stream was cut short: the error event, then [DONE], within 2 s of the kill.
    _assert_cut_short(stream.events)
    assert stream_ended_after < 2.0
    # Meanwhile: not ready, and a plain 503 with Retry-After (never Triton's "not healthy" text).
    assert ready.status_code == 503
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "backend_unavailable" and refused_after < 3.0
    assert answered is not None and answered.json()["usage"]["completion_tokens"] == 2
    assert f"the model's process (pid {stub}) died" in output, output  # maybe with the server's abort
    assert "; restarting tritonserver" in output, output
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
            restart_s = supervisor.HANG_RESTART_S + supervisor.PROBE_INTERVAL_S + 120
            answered = post_until_ok(http, "/v1/chat/completions", body, restart_s, 0.5)
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
    stream = _Stream(f"http://127.0.0.1:{port}", body, auth)
    try:
        stub, _, crashed, stream_ended_after = _kill_mid_stream(launcher, port, lines, stream, signal.SIGSEGV)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers=auth) as http:
            refused = http.post("/v1/chat/completions", json={**body, "max_tokens": 2})
            refused_after = time.monotonic() - crashed
            assert stream_ended_after < 2.0, stream_ended_after
            assert refused.status_code == 503 and refused_after < 2.0, (refused.status_code, refused_after)
            # A loaded machine reloads the model slowly.
            answered = _answered_again(launcher, lines, http, {**body, "max_tokens": 2}, 300, 0.25)
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    output = "".join(lines)
    _assert_cut_short(stream.events)
    assert answered is not None and answered.json()["usage"]["completion_tokens"] == 2
    # Triton's Python backend sometimes aborts the server when a stub dies mid-send: the dead stub
    # is still what the launcher names, with the server's exit after it.
    assert f"the model's process (pid {stub}) died" in output, output
    assert "; restarting tritonserver" in output, output
    assert code == 0, output
