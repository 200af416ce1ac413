"""Operations through the real tritonserver: tokenize, version, docs, CORS, request ids, JSON logs,
and SSE keep-alives while a request waits in the queue."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from openai_frontend.launcher.network import free_port
from tests.e2e.conftest import TritonHandle
from tests.e2e.processes import stop, wait_for
from tests.e2e.test_chat_e2e import QUESTION, client_for

ORIGIN = "https://app.example.com"
BLOCKERS = 8  # the session server's max_num_seqs: this many long requests fill every slot


def test_tokenize_counts_what_a_chat_request_is_charged(triton_server: TritonHandle, frontend_url: str) -> None:
    model = triton_server.served_model_name
    with httpx.Client(base_url=frontend_url, timeout=60) as http:
        tokenized = http.post("/tokenize", json={"model": model, "messages": QUESTION})
        without = http.post("/tokenize", json={"model": model, "messages": QUESTION, "add_generation_prompt": False})
        back = http.post("/detokenize", json={"model": model, "tokens": tokenized.json()["tokens"]})
        prompt = http.post("/tokenize", json={"model": model, "prompt": "The capital of France is"})
        outside = http.post("/detokenize", json={"model": model, "tokens": [1, 10**9]})
    reply = client_for(frontend_url).chat.completions.create(model=model, messages=QUESTION, max_tokens=1)
    assert tokenized.status_code == 200
    body = tokenized.json()
    assert set(body) == {"count", "max_model_len", "tokens"}
    assert reply.usage is not None and body["count"] == reply.usage.prompt_tokens == len(body["tokens"])
    assert body["max_model_len"] == triton_server.settings.max_seq_len
    assert without.json()["count"] < body["count"]
    assert back.status_code == 200 and QUESTION[0]["content"] in back.json()["prompt"]
    assert prompt.status_code == 200 and prompt.json()["count"] > 0
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "tokens.1"


def test_version_and_the_docs_page(frontend_url: str) -> None:
    with httpx.Client(base_url=frontend_url, timeout=30) as http:
        version = http.get("/version")
        page = http.get("/docs")
    assert version.status_code == 200 and version.json()["version"]
    try:
        import swagger_ui_bundle  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        assert page.status_code == 404 and "swagger-ui-bundle" in page.json()["error"]["message"]
        return
    assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text
    with httpx.Client(base_url=frontend_url, timeout=30) as http:
        script = http.get("/docs/assets/swagger-ui-bundle.js")
    assert script.status_code == 200 and "SwaggerUIBundle" in script.text


def test_a_browser_preflight_from_an_allowed_origin_succeeds(
    triton_server: TritonHandle, frontend_factory: Callable[..., str]
) -> None:
    url = frontend_factory(allowed_origins=[ORIGIN], api_keys=["sk-e2e"])
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    with httpx.Client(base_url=url, timeout=60) as http:
        allowed = http.options("/v1/chat/completions", headers={"Origin": ORIGIN, **preflight})
        other = http.options("/v1/chat/completions", headers={"Origin": "https://other.test", **preflight})
        answer = http.post(
            "/v1/chat/completions",
            json={"model": triton_server.served_model_name, "messages": QUESTION, "max_tokens": 2},
            headers={"Origin": ORIGIN, "Authorization": "Bearer sk-e2e"},
        )
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == ORIGIN


def test_the_request_id_names_the_answer_through_the_openai_client(
    triton_server: TritonHandle, frontend_url: str
) -> None:
    client = client_for(frontend_url)
    raw = client.chat.completions.with_raw_response.create(
        model=triton_server.served_model_name, messages=QUESTION, max_tokens=2, extra_headers={"X-Request-Id": "e2e-42"}
    )
    assert raw.headers["x-request-id"] == "e2e-42"
    assert raw.parse().id == "chatcmpl-e2e-42"
    stream = client.chat.completions.with_raw_response.create(
        model=triton_server.served_model_name,
        messages=QUESTION,
        max_tokens=2,
        stream=True,
        extra_headers={"X-Request-Id": "bad id"},
    )
    generated = stream.headers["x-request-id"]
    assert generated != "bad id"
    assert {chunk.id for chunk in stream.parse()} == {f"chatcmpl-{generated}"}


@pytest.fixture
def full_engine(triton_server: TritonHandle, frontend_url: str) -> Iterator[threading.Event]:
    """Every engine slot taken by a long stream until the test sets the event (streams then close)."""
    release = threading.Event()
    running = threading.Semaphore(0)
    body = {
        "model": triton_server.served_model_name,
        "messages": QUESTION,
        "max_tokens": 30000,
        "ignore_eos": True,
        "stream": True,
    }

    def hold() -> None:
        with (
            httpx.Client(base_url=frontend_url, timeout=120) as http,
            http.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            running.release()
            release.wait(120)  # closing the stream then cancels the request in the engine

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(BLOCKERS)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert running.acquire(timeout=120), "the blocking streams did not start"
    try:
        yield release
    finally:
        release.set()
        for thread in threads:
            thread.join(60)


def test_a_queued_stream_gets_headers_at_once_and_keepalives(
    triton_server: TritonHandle, frontend_factory: Callable[..., str], full_engine: threading.Event
) -> None:
    url = frontend_factory(sse_keepalive_s=0.2)
    body = {"model": triton_server.served_model_name, "messages": QUESTION, "max_tokens": 3, "stream": True}
    with (
        httpx.Client(base_url=url, timeout=120) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200  # sent while the request waits for a slot
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        waiting = [next(lines) for _ in range(4)]  # two comments, each with its blank line
        full_engine.set()  # free the slots: the queued request runs
        rest = list(lines)
    assert waiting == [": keep-alive", "", ": keep-alive", ""]
    data = [line[len("data: ") :] for line in rest if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_json_log_lines_from_the_launcher_and_the_frontend(triton_server: TritonHandle, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "frontend.log"
    cmd = [
        sys.executable, "-m", "openai_frontend.launcher", "frontend", "--triton-url", triton_server.grpc_url,
        "--served-model-name", triton_server.served_model_name, "--port", str(port), "--log-format", "json",
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, stdout=sink, stderr=sink, start_new_session=True)
        try:
            wait_for(process, f"http://127.0.0.1:{port}/health")
            headers = {"X-Request-Id": "e2e-logged.1"}
            assert httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers, timeout=30).status_code == 200
            deadline = time.monotonic() + 30
            while "/v1/models" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)  # the access line is written after the answer
        finally:
            stop(process)
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    loggers = {entry["logger"] for entry in entries}
    assert {"openai_frontend.launcher", "uvicorn.access"} <= loggers
    assert any("GET /v1/models" in entry["message"] for entry in entries)
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)
    # The request's lines carry its id; the launcher's, logged outside any request, none.
    assert [e.get("request_id") for e in entries if "GET /v1/models" in e["message"]] == ["e2e-logged.1"]
    assert all("request_id" not in e for e in entries if e["logger"] == "openai_frontend.launcher")


def test_the_model_process_on_cpu_keeps_freed_memory(triton_server: TritonHandle) -> None:
    """cpu_keep_freed_memory (on by default) reaches the model's process: its log says the heap policy."""
    if triton_server.settings.device != "cpu" or platform.libc_ver()[0] != "glibc":
        pytest.skip("the policy applies to a model on CPU, with glibc")
    log = triton_server.process.log_path.read_text(errors="replace")
    assert "glibc heap: blocks under 32 MiB from the heap, freed memory kept" in log
