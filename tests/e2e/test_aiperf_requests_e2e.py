"""The HTTP requests aiperf sends, replayed with plain httpx: aiperf's contract is checked on every
run, also where aiperf is not installed.

``data/aiperf_requests.json`` holds what aiperf 0.13.0 sent when it ran docs/own-triton.md's two
commands (recorded by a proxy in front of the servers): eight streaming ``generate_stream`` posts
to Triton's HTTP endpoint from its ``template`` endpoint, and eight streaming chat completions to
the frontend. Each is sent again as it was (headers and body bytes; only the model name of a chat
request is this server's), and the answer is read the way aiperf reads it: the SSE ``data:``
events, the ``text_output`` its template's ``response_field`` names, the chat deltas and usage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import TritonHandle

pytestmark = pytest.mark.e2e

DATA = Path(__file__).parent / "data" / "aiperf_requests.json"
TIMEOUT_S = 120.0


def _captured(kind: str) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = json.loads(DATA.read_text(encoding="utf-8"))[kind]
    return requests


def _events(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data:"):
            yield line[len("data:") :].strip()


def _replay(client: httpx.Client, request: dict[str, Any], body: str) -> tuple[httpx.Response, list[str]]:
    with client.stream(request["method"], request["path"], headers=request["headers"], content=body.encode()) as reply:
        return reply, list(_events(reply)) if reply.status_code == 200 else [reply.read().decode()]


@pytest.mark.parametrize("index", range(len(_captured("triton"))))
def test_triton_streams_text_output_to_aiperfs_template_requests(triton_server: TritonHandle, index: int) -> None:
    request = _captured("triton")[index]
    assert request["path"] == f"/v2/models/{triton_server.model_name}/generate_stream"
    with triton_server.http_client(TIMEOUT_S) as client:
        reply, events = _replay(client, request, request["body"])
    assert reply.status_code == 200, events
    assert reply.headers["content-type"].startswith("text/event-stream")
    answers = [json.loads(event) for event in events]
    assert answers and all("error" not in answer for answer in answers), answers
    assert all(isinstance(answer["text_output"], str) for answer in answers)  # aiperf's response_field
    assert "".join(answer["text_output"] for answer in answers)


def test_triton_reads_the_request_parameters_aiperf_sends(triton_server: TritonHandle) -> None:
    """aiperf's max_tokens and ignore_eos arrive as Triton request parameters (not a tensor): the
    same request, asking for the per-response token counts, gets exactly max_tokens tokens. Its
    16 is also the vLLM default a request without max_tokens gets, so the count asked for here
    is another one."""
    request = _captured("triton")[0]
    body = json.loads(request["body"])
    assert set(body) == {"text_input", "max_tokens", "stream", "ignore_eos"}
    counted = json.dumps({**body, "max_tokens": 5, "return_num_output_tokens": True})
    with triton_server.http_client(TIMEOUT_S) as client:
        reply, events = _replay(client, request, counted)
    assert reply.status_code == 200, events
    assert sum(json.loads(event)["num_output_tokens"] for event in events) == 5


@pytest.mark.parametrize("index", range(len(_captured("chat"))))
def test_the_frontend_streams_chat_with_usage_to_aiperfs_requests(
    frontend_url: str, triton_server: TritonHandle, index: int
) -> None:
    request = _captured("chat")[index]
    body = json.loads(request["body"])
    body["model"] = triton_server.served_model_name  # the only change: this server's model name
    with httpx.Client(base_url=frontend_url, timeout=TIMEOUT_S) as client:
        reply, events = _replay(client, request, json.dumps(body))
    assert reply.status_code == 200, events
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    text = "".join(
        choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"] if "delta" in choice
    )
    assert text
    (usage,) = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    # ignore_eos: every request runs to the max_completion_tokens aiperf asked for.
    assert usage["completion_tokens"] == body["max_completion_tokens"]
