"""The served path end to end: real tritonserver + frontend, driven by the clients users run.

The tiny model's text is random, so these tests assert what a user can check on any model:
formats, finish reasons, usage invariants, errors, cancellation and agreement between paths.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import TritonHandle
from tests.e2e.processes import start_frontend, stop, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]


def client_for(frontend_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{frontend_url}/v1", api_key="unused", max_retries=0, timeout=120)


def stream_chunks(client: openai.OpenAI, model: str, max_tokens: int, **options: Any) -> list[Any]:
    """Every chunk of a streamed answer to ``QUESTION`` (``options``: the client's other arguments)."""
    return list(
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=max_tokens, stream=True, **options)
    )


def error_body(error: openai.APIStatusError) -> dict[str, Any]:
    """The error envelope's ``error`` object, as the openai client parsed it."""
    body = error.body
    assert isinstance(body, dict), body
    return body


def check_usage_invariants(usage: dict[str, Any], choices: int = 1) -> None:
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # The prefix cache may serve a repeated prompt's start, never its last token.
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]
    if choices == 1:
        assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == usage["completion_tokens"]
    assert all(b >= 1 for b in usage["batch_size"])
    assert all(isinstance(q, int) and q >= 0 for q in usage["queue_wait_time"])


def test_openai_client_non_streaming(triton_server: TritonHandle, frontend_url: str) -> None:
    reply = client_for(frontend_url).chat.completions.create(
        model=triton_server.served_model_name, messages=QUESTION, max_tokens=12, temperature=0
    )
    assert reply.object == "chat.completion"
    assert reply.model == triton_server.served_model_name
    choice = reply.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    raw = reply.model_dump()
    check_usage_invariants(raw["usage"])
    assert len(raw["decode_time_arr"]) == raw["usage"]["completion_tokens"] - 1
    assert raw["prefill_time"] > 0


def test_openai_client_streaming_matches_non_streaming(triton_server: TritonHandle, frontend_url: str) -> None:
    client = client_for(frontend_url)
    model = triton_server.served_model_name
    reply = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, temperature=0)
    whole = reply.choices[0].message.content
    chunks = list(
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, temperature=0, stream=True)
    )
    assert chunks, "no chunks"
    assert all(len(c.choices) == 1 and c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.choices[0].delta.role == "assistant" for c in chunks)  # MindIE: role on every delta
    assert [c.choices[0].finish_reason is None for c in chunks] == [True] * (len(chunks) - 1) + [False]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    last = chunks[-1].model_dump()
    check_usage_invariants(last["usage"])
    assert all(c.usage is None for c in chunks[:-1])


def test_non_streaming_best_of_returns_the_best_n(triton_server: TritonHandle, frontend_url: str) -> None:
    # The backend is asked for whole answers when the client does not stream; asked to stream,
    # it refused best_of > n ("'best_of' must equal 'n' when streaming").
    body = {
        "model": triton_server.served_model_name, "messages": QUESTION, "max_tokens": 6,
        "temperature": 0.8, "seed": 7, "n": 2, "best_of": 3,
    }  # fmt: skip
    response = httpx.post(f"{frontend_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert all(c["finish_reason"] in ("stop", "length") for c in choices)
    check_usage_invariants(response.json()["usage"], choices=2)


def test_raw_sse_framing(triton_server: TritonHandle, frontend_url: str) -> None:
    body = {"model": triton_server.served_model_name, "messages": QUESTION, "max_tokens": 6, "stream": True}
    with httpx.Client(timeout=60) as http:
        reply = http.post(f"{frontend_url}/v1/chat/completions", json=body)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: {") and "\n" not in event
        chunk = json.loads(event[len("data: ") :])
        assert chunk["id"].startswith("chatcmpl-")
        assert isinstance(chunk["created"], int)


def test_tritonclient_example_script_talks_to_the_model_directly(triton_server: TritonHandle) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "tritonclient_chat.py"), "--url", triton_server.grpc_url,
         "--max-tokens", "5", "Hello there"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    tail = result.stdout.splitlines()[-1]
    assert tail.startswith("[finish_reason=")
    usage = json.loads(tail.split("usage: ", 1)[1])
    assert usage["completion_tokens"] <= 5 and len(usage["batch_size"]) == usage["completion_tokens"]


def stream_text_input(triton: TritonHandle, flags: dict[str, bool]) -> list[dict[str, object]]:
    """A raw-prompt tritonclient stream in our contract (``text_input`` with our parameters
    tensor; test_vllm_contract_e2e covers the vLLM backend's); each response's outputs."""

    def tensor(name: str, value: object, datatype: str) -> grpcclient.InferInput:
        array = np.array([value], dtype=np.object_ if datatype == "BYTES" else bool)
        entry = grpcclient.InferInput(name, [1], datatype)
        entry.set_data_from_numpy(array)
        return entry

    inputs = [
        tensor("text_input", b"Once upon a time", "BYTES"),
        tensor(
            "generation_parameters",
            json.dumps({"max_tokens": 4, "ignore_eos": True, "temperature": 0}).encode(),
            "BYTES",
        ),
        tensor("stream", True, "BOOL"),
        *(tensor(name, value, "BOOL") for name, value in flags.items()),
    ]
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    responses: list[dict[str, object]] = []
    try:
        client.async_stream_infer(triton.model_name, inputs, enable_empty_final_response=True)
        for _ in range(100):  # bounded: four tokens and a final flag
            result, error = got.get(timeout=120)
            assert error is None, error
            response = result.get_response()
            responses.append({o.name: result.as_numpy(o.name)[0] for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return [r for r in responses if r]


def token_count(response: dict[str, object], name: str) -> int:
    value = response[name]
    assert isinstance(value, np.integer), f"{name} is {value!r}"
    return int(value)


def test_token_counts_come_last_or_with_every_response_when_asked(triton_server: TritonHandle) -> None:
    # A token whose text is held back (part of a UTF-8 character) sends no response of its own,
    # so a random model's four tokens may come in fewer responses; the counts say how many.
    plain = stream_text_input(triton_server, {})
    assert plain[-1]["finish_reason"] == b"length"
    assert all(set(r) == {"text_output"} for r in plain[:-1])  # a streamed token is one tensor
    assert plain[-1]["num_output_tokens"] == 4 and token_count(plain[-1], "num_input_tokens") > 0
    counted = stream_text_input(triton_server, {"return_num_output_tokens": True})
    counts = [token_count(r, "num_output_tokens") for r in counted]
    assert len(counted) >= 2 and counts == sorted(set(counts)) and counts[-1] == 4
    assert all(set(r) == {"text_output", "num_output_tokens"} for r in counted[:-1])


def running_sequences(triton_server: TritonHandle) -> float:
    """The engine's running-batch gauge, as Triton's /metrics publishes it."""
    text = triton_server.process.read_metrics()
    for line in text.splitlines():
        if line.startswith("triton_chat_num_sequences_running{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("triton_chat_num_sequences_running is not published")


def wait_for_gauge(triton_server: TritonHandle, predicate: Callable[[float], bool], timeout: float) -> float:
    deadline = time.monotonic() + timeout
    value = running_sequences(triton_server)
    while not predicate(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = running_sequences(triton_server)
    return value


def test_disconnect_mid_stream_frees_the_engine_slot(triton_server: TritonHandle, frontend_url: str) -> None:
    body = {
        "model": triton_server.served_model_name, "messages": QUESTION, "stream": True,
        "max_tokens": 30000, "ignore_eos": True,
    }  # fmt: skip
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{frontend_url}/v1/chat/completions", json=body) as reply,
    ):
        assert reply.status_code == 200
        # Hold the iterator (leaving a `for` loop early would close the connection already).
        lines = reply.iter_lines()
        seen = 0
        while seen < 3:
            seen += next(lines).startswith("data: {")
        assert wait_for_gauge(triton_server, lambda v: v >= 1, 5) >= 1  # still generating
        reply.close()
        closed_at = time.monotonic()
    # Closing the response closed the connection: the frontend cancels the gRPC stream, the
    # model sees is_cancelled() and drops the sequence long before its 30000 tokens are done.
    assert wait_for_gauge(triton_server, lambda v: v == 0, 5) == 0
    assert time.monotonic() - closed_at < 2.0


def test_bad_request_gets_a_400_envelope_naming_the_field(triton_server: TritonHandle, frontend_url: str) -> None:
    client = client_for(frontend_url)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=triton_server.served_model_name, messages=QUESTION, temperature=-1)
    error = error_body(caught.value)
    assert error["param"] == "temperature" and error["type"] == "invalid_request_error"
    # A rule only the model can check (it owns the tokenizer): the prompt's token count.
    # The server allows 1024 prompt tokens.
    too_long: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * 1500}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=triton_server.served_model_name, messages=too_long, max_tokens=4)
    assert error_body(caught.value)["code"] == "context_length_exceeded"
    assert error_body(caught.value)["param"] == "messages"


def test_bad_request_leaves_the_server_serving(triton_server: TritonHandle, frontend_url: str) -> None:
    with httpx.Client(timeout=60) as http:
        broken = http.post(
            f"{frontend_url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert broken.status_code == 400 and "error" in broken.json()
        ok = http.post(
            f"{frontend_url}/v1/chat/completions",
            json={"model": triton_server.served_model_name, "messages": QUESTION, "max_tokens": 3},
        )
        assert ok.status_code == 200
        assert http.get(f"{frontend_url}/health/ready").status_code == 200


def test_concurrent_requests_share_decode_steps(triton_server: TritonHandle, frontend_url: str) -> None:
    import concurrent.futures

    client = client_for(frontend_url)

    def ask(i: int) -> dict[str, Any]:
        reply = client.chat.completions.create(
            model=triton_server.served_model_name, messages=[{"role": "user", "content": f"question {i}"}],
            max_tokens=40, extra_body={"ignore_eos": True},
        )  # fmt: skip
        return reply.model_dump()["usage"]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        usages = list(pool.map(ask, range(4)))
    assert all(u["completion_tokens"] == 40 for u in usages)
    assert max(max(u["batch_size"]) for u in usages) > 1


def test_frontend_subcommand_serves_an_existing_triton(triton_server: TritonHandle) -> None:
    process, port = start_frontend(triton_server.grpc_url, triton_server.served_model_name)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while wait_for(process, f"{url}/health/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        reply = client_for(url).chat.completions.create(
            model=triton_server.served_model_name, messages=QUESTION, max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens <= 4
    finally:
        code = stop(process)
    assert code == 0


def test_json_schema_response_format_through_the_openai_client(triton_server: TritonHandle, frontend_url: str) -> None:
    schema: dict[str, object] = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "capital": {"type": "boolean"}},
        "required": ["city", "capital"],
        "additionalProperties": False,
    }
    reply = client_for(frontend_url).chat.completions.create(
        model=triton_server.served_model_name, messages=QUESTION, max_tokens=40, temperature=0.8, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )  # fmt: skip
    value = json.loads(reply.choices[0].message.content or "")
    assert value["city"] in ("Paris", "Rome") and isinstance(value["capital"], bool)
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(frontend_url).chat.completions.create(
            model=triton_server.served_model_name, messages=QUESTION,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        )  # fmt: skip
    assert error_body(caught.value)["param"] == "response_format"


def test_lora_adapter_name_is_a_404_when_unknown(triton_server: TritonHandle, frontend_url: str) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client_for(frontend_url).chat.completions.create(model="no-such-adapter", messages=QUESTION, max_tokens=2)
    assert error_body(caught.value)["code"] == "model_not_found"


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:3072", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0, reason="no openssl")
def test_frontend_serves_https(triton_server: TritonHandle, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    process, port = start_frontend(
        triton_server.grpc_url, triton_server.served_model_name, "--tls-cert", str(cert), "--tls-key", str(key)
    )
    try:
        reply = wait_for(process, f"https://127.0.0.1:{port}/health", verify=str(cert))
        assert reply.status_code == 200
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port is refused
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        code = stop(process)
    assert code == 0
