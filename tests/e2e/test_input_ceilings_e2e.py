"""The input ceilings through the real tritonserver: a tool schema 450 levels of properties deep
(once a RecursionError in the chat template, a 500 and a long traceback in the server's log) and a
/tokenize prompt over 4 MiB are 400s naming the field, from the frontend and from the model itself
(tritonclient callers skip the frontend), and the server keeps serving."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import numpy as np

from python_backend.protocol import contract
from python_backend.protocol.errors import ErrorInfo
from python_backend.protocol.input_limits import MAX_INPUT_CHARS, MAX_NESTING_DEPTH
from python_backend.protocol.tokenize import TokenizeQuery
from tests.e2e.conftest import SERVED_MODEL_NAME, TritonHandle

WAIT_S = 120.0
HELLO = [{"role": "user", "content": "Say hello."}]


def deep_tools(properties: int) -> list[dict[str, Any]]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(properties):
        schema = {"type": "object", "properties": {"a": schema}}
    return [{"type": "function", "function": {"name": "lookup", "parameters": schema}}]


def model_error(triton: TritonHandle, tensors: dict[str, np.ndarray]) -> ErrorInfo | None:
    """The model's error for one request sent as tritonclient sends it (None: it answered)."""
    _, error = triton.first_response(tensors, WAIT_S)  # an error is the request's one response
    return None if error is None else ErrorInfo.from_wire(str(error))


def _log_size(triton: TritonHandle) -> int:
    path = triton.process.log_path
    return path.stat().st_size if path.exists() else 0


def _log_since(triton: TritonHandle, offset: int) -> str:
    path = triton.process.log_path
    if not path.exists() or path.stat().st_size < offset:
        return ""  # the log was rotated meanwhile: what was written is elsewhere
    with open(path, "rb") as log:
        log.seek(offset)
        return log.read().decode("utf-8", "replace")


def _chat_ok(frontend_url: str) -> None:
    body = {"model": SERVED_MODEL_NAME, "messages": HELLO, "max_tokens": 4}
    reply = httpx.post(f"{frontend_url}/v1/chat/completions", json=body, timeout=WAIT_S)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] is not None


def test_a_tool_schema_450_levels_deep_is_a_400_naming_it_and_the_server_keeps_serving(
    triton_server: TritonHandle, frontend_url: str
) -> None:
    offset = _log_size(triton_server)
    tools = deep_tools(450)
    body = {"model": triton_server.served_model_name, "messages": HELLO, "tools": tools, "max_tokens": 4}
    reply = httpx.post(f"{frontend_url}/v1/chat/completions", json=body, timeout=WAIT_S)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "tools.0.function.parameters"
    assert f"deeper than {MAX_NESTING_DEPTH} levels" in error["message"]
    # The model's own check, for callers that skip the frontend: the template never sees it.
    direct = model_error(
        triton_server,
        {
            contract.MESSAGES: contract.bytes_tensor(json.dumps(HELLO)),
            contract.PARAMETERS: contract.json_tensor({"tools": tools, "max_tokens": 4}),
        },
    )
    assert direct is not None and (direct.status, direct.param) == (400, "tools.0.function.parameters")
    _chat_ok(frontend_url)
    written = _log_since(triton_server, offset)
    assert "Traceback" not in written and "RecursionError" not in written


def test_a_tokenize_prompt_over_the_ceiling_is_refused_at_once(triton_server: TritonHandle, frontend_url: str) -> None:
    prompt = "word " * (MAX_INPUT_CHARS // 5 + 200_000)  # about 5 MB
    started = time.monotonic()
    reply = httpx.post(
        f"{frontend_url}/tokenize", json={"model": triton_server.served_model_name, "prompt": prompt}, timeout=WAIT_S
    )
    took = time.monotonic() - started
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "prompt" and str(MAX_INPUT_CHARS) in error["message"]
    assert took < 10.0  # a body's parse; tokenizing it took minutes at 48 MB
    direct = model_error(
        triton_server, {contract.TOKENIZE: contract.bytes_tensor(TokenizeQuery(prompt=prompt).to_wire())}
    )
    assert direct is not None and (direct.status, direct.param) == (400, "prompt")
    _chat_ok(frontend_url)
