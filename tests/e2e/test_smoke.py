"""Smoke tests of the e2e fixtures and the launcher: the real tritonserver with the tiny model.

Structure only (a random model's text is noise): responses arrive, every request ends with one
final response, usage is consistent, and the launcher starts and stops without leftovers.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient

from openai_frontend.launcher.network import free_port
from python_backend.protocol import contract
from tests.e2e.conftest import TritonHandle
from tests.e2e.processes import group_pids

REPO_ROOT = Path(__file__).resolve().parents[2]


def _stream(handle: TritonHandle, inputs: dict[str, Any]) -> list[contract.ChoiceDelta]:
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(handle.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        tensors = []
        for name, array in inputs.items():
            spec = next(s for s in contract.INPUT_SPECS if s.name == name)
            tensor = grpcclient.InferInput(name, list(array.shape), spec.datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        client.async_stream_infer(handle.model_name, tensors, enable_empty_final_response=True)
        deltas = []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                deltas.append(contract.decode_delta({o.name: result.as_numpy(o.name) for o in response.outputs}))
            if response.parameters["triton_final_response"].bool_param:
                return deltas
    finally:
        client.stop_stream()
        client.close()


def test_tritonclient_streams_a_chat_to_the_end(triton_server: TritonHandle) -> None:
    deltas = _stream(
        triton_server,
        {
            contract.MESSAGES: contract.json_tensor([{"role": "user", "content": "Hello"}]),
            contract.PARAMETERS: contract.json_tensor({"max_tokens": 8, "temperature": 0}),
            contract.STREAM: contract.bool_tensor(True),
        },
    )
    assert deltas
    last = deltas[-1]
    assert last.finish_reason in ("stop", "length")
    assert last.usage is not None and 1 <= last.usage.completion_tokens <= 8
    assert all(d.finish_reason is None for d in deltas[:-1])


def test_the_health_probe_is_answered_at_once_beside_a_running_stream(
    triton_server: TritonHandle, frontend_url: str
) -> None:
    """``health_probe`` (what ``/health/ready`` asks): one final response with the engine's
    health, also while the engine is busy, without entering the batch."""
    body = {"model": triton_server.served_model_name, "messages": [{"role": "user", "content": "go"}],
            "max_tokens": 3000, "ignore_eos": True, "stream": True}  # fmt: skip
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{frontend_url}/v1/chat/completions", json=body) as reply,
    ):
        lines = reply.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # the engine is decoding now
        started = time.monotonic()
        (delta,) = _stream(triton_server, {contract.HEALTH_PROBE: contract.bool_tensor(True)})
        probe_s = time.monotonic() - started
        ready = http.get(f"{frontend_url}/health/ready")
        rest = [line for line in lines if line.startswith("data: ")]
    health = json.loads(delta.text)
    assert health["status"] == "ready" and health["running"] and health["busy"] and health["failure"] is None
    assert probe_s < 2.0
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert rest[-1] == "data: [DONE]"  # the stream beside it was not disturbed
    assert json.loads(rest[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"


def test_frontend_lists_the_model_and_answers(triton_server: TritonHandle, frontend_url: str) -> None:
    with httpx.Client(base_url=frontend_url, timeout=60) as http:
        models = http.get("/v1/models").json()
        assert triton_server.served_model_name in [m["id"] for m in models["data"]]
        body = {
            "model": triton_server.served_model_name,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
        }
        reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        data = reply.json()
        assert data["choices"][0]["finish_reason"] in ("stop", "length")
        assert 1 <= data["usage"]["completion_tokens"] <= 8


def _start_launcher(
    tiny_model_dir: Path, tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    """``serve`` with the tiny model on a free port; ``env`` adds to this process's environment."""
    port = free_port()
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, "-m", "openai_frontend.launcher", "serve", "--model", str(tiny_model_dir),
        "--served-model-name", "tiny", "--port", str(port), "--dtype", "float32", "--device", "cpu",
        "--max-iter-times", "16", "--triton-log", str(tmp_path / "tritonserver.log"), "--ready-timeout", "180",
        *extra,
    ]  # fmt: skip
    # Its own session, like a terminal job: the launcher must stop its tritonserver itself.
    launcher = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return launcher, port


def _read_until(launcher: subprocess.Popen[str], marker: str, lines: list[str], timeout: float = 240) -> None:
    assert launcher.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = launcher.stderr.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return
    raise AssertionError(f"launcher never said {marker!r}:\n" + "".join(lines))


def _finish(launcher: subprocess.Popen[str], stop_signal: int, lines: list[str]) -> int:
    launcher.send_signal(stop_signal)
    try:
        _, remaining = launcher.communicate(timeout=90)
        lines.append(remaining or "")
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    return launcher.returncode


def _triton_pid(lines: list[str]) -> int:
    return next(int(line.split("pid ")[1].split(")")[0]) for line in lines if "started tritonserver (pid" in line)


def _stream_chunks(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200, reply.read()
        data = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def test_launcher_serves_then_stops_cleanly_on_ctrl_c(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Also the launcher's --stream-interval: 4 tokens per streamed response after the first.
    launcher, port = _start_launcher(tiny_model_dir, tmp_path, "--stream-interval", "4")
    lines: list[str] = []
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1 (Triton gRPC at unix:", lines)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            assert http.get("/v1/models").json()["data"][0]["id"] == "tiny"
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            assert http.post("/v1/chat/completions", json=body).status_code == 200
            body = {**body, "max_tokens": 16, "ignore_eos": True}
            chunks = _stream_chunks(http, body)
            # 16 tokens: the first text, then 4 tokens a response, the rest with the finish reason.
            assert 2 <= len(chunks) <= 6, chunks
            assert chunks[-1]["usage"]["completion_tokens"] == 16
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    output = "".join(lines)
    assert code == 0, output
    assert group_pids(_triton_pid(lines)) == []
    # A clean unload needs no SIGKILL and no shm clean-up of ours. Seen failing when the frontend
    # cancels a gRPC stream after its final response: Triton 2.51's Python backend then
    # sometimes never finalizes the model on SIGTERM (reproduced with the aio client alone).
    assert "tritonserver stopped (status 0)" in output, output
    assert "removing shared memory" not in output, output
    assert not [p for p in Path(tempfile.gettempdir()).glob("triton-chat-*") if str(tiny_model_dir) in _read(p)]
    # The model's process ends without a crash after its unload (it segfaulted when finalize
    # unfroze the start-up objects for a last collection).
    log = re.search(r"; log: (\S+\.log)", output)
    assert log is not None, output
    server_log = Path(log.group(1)).read_text(errors="replace")
    assert "successfully unloaded" in server_log and "Fatal Python error" not in server_log, server_log[-3000:]


@pytest.mark.slow
def test_launcher_drains_on_sigterm(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Readiness and new requests 503 at once, the stream in flight ends with [DONE], then a clean
    # exit. A long answer keeps the stream running when SIGTERM arrives; the drain allows it 600 s,
    # room for 4000 tokens even at 7 tokens/s on a machine busy with other work.
    launcher, port = _start_launcher(tiny_model_dir, tmp_path, "--max-iter-times", "4000", "--drain-timeout", "600")
    lines: list[str] = []
    finished: queue.Queue[list[str]] = queue.Queue()
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        base = f"http://127.0.0.1:{port}"
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "max_tokens": 4000, "ignore_eos": True}  # fmt: skip
        first_chunk = threading.Event()

        def stream() -> None:
            with (
                httpx.Client(base_url=base, timeout=120) as http,
                http.stream("POST", "/v1/chat/completions", json=body) as reply,
            ):
                got = []
                for line in reply.iter_lines():
                    got.append(line)
                    first_chunk.set()
                finished.put(got)

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert first_chunk.wait(60)
        launcher.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        with httpx.Client(base_url=base, timeout=10) as http:
            ready = http.get("/health/ready")
            while ready.status_code == 200 and time.monotonic() - signalled < 5:
                ready = http.get("/health/ready")
            refused = http.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 2})
        assert finished.empty(), "the stream ended before the drain began; make it longer"
        got = finished.get(timeout=600)
        code = launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "server_draining"
    assert refused.status_code == 503 and "retry-after" in refused.headers
    data = [line.removeprefix("data: ") for line in got if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["usage"]["completion_tokens"] == 4000
    assert launcher.stderr is not None
    output = "".join(lines) + launcher.stderr.read()
    assert code == 0, output
    assert "SIGTERM: draining 1 request(s) in flight" in output, output
    assert "tritonserver stopped (status 0)" in output, output
    assert group_pids(_triton_pid(lines)) == []


def test_past_the_drain_deadline_the_launcher_exits_within_2_s(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A stream far longer than the drain allows: at the deadline it is cut, and the launcher does
    # not wait for the model's graceful unload (seconds of the stub's teardown) before exiting.
    drain_s = 1.0
    launcher, port = _start_launcher(
        tiny_model_dir, tmp_path, "--max-iter-times", "30000", "--max-seq-len", "32768", "--drain-timeout", str(drain_s)
    )
    lines: list[str] = []
    first_chunk = threading.Event()
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "max_tokens": 30000, "ignore_eos": True}  # fmt: skip

        def stream() -> None:
            with (
                httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http,
                http.stream("POST", "/v1/chat/completions", json=body) as reply,
            ):
                for _ in reply.iter_lines():
                    first_chunk.set()

        threading.Thread(target=stream, daemon=True).start()
        assert first_chunk.wait(60)
        launcher.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = launcher.wait(timeout=60)
        exited_after = time.monotonic() - signalled
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.stderr is not None
    output = "".join(lines) + launcher.stderr.read()
    assert code == 0, output
    assert "drain deadline passed: stopping tritonserver now" in output, output
    assert exited_after <= drain_s + 2.0, (exited_after, output)
    assert group_pids(_triton_pid(lines)) == []


def test_launcher_stops_tritonserver_when_terminated_while_loading(tiny_model_dir: Path, tmp_path: Path) -> None:
    launcher, _ = _start_launcher(tiny_model_dir, tmp_path)
    lines: list[str] = []
    try:
        _read_until(launcher, "started tritonserver (pid", lines)
    finally:
        code = _finish(launcher, signal.SIGTERM, lines)
    output = "".join(lines)
    assert code == 0, output
    assert "interrupted while starting" in output
    assert group_pids(_triton_pid(lines)) == []
    assert not [p for p in Path(tempfile.gettempdir()).glob("triton-chat-*") if str(tiny_model_dir) in _read(p)]


def _read(run_dir: Path) -> str:
    config = run_dir / "models" / "triton_chat" / "config.pbtxt"
    try:
        return config.read_text()
    except OSError:
        return ""
