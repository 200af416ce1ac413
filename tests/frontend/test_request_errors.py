"""Bad requests: every non-2xx is the OpenAI envelope naming the field; the backend sees nothing."""

from __future__ import annotations

import re

import pytest
from frontend_fakes import FakeBackend, chat_body, client_for

ENVELOPE_KEYS = {"message", "type", "param", "code"}
LEAK = re.compile(r"Traceback|File \"|0x[0-9a-f]{8,}|/work/|/usr/|site-packages")


def assert_envelope(response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == ENVELOPE_KEYS
    assert body["error"]["message"]
    assert not LEAK.search(response.text)
    if param is not None:
        assert body["error"]["param"] == param
    return body["error"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": -5}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"n": 2, "temperature": 0}, "temperature"),
        ({"n": 129, "temperature": 1}, "n"),
        ({"stream": True, "best_of": 2, "temperature": 1}, "best_of"),
        ({"stream": "yes"}, "stream"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"max_completion_tokens": "many"}, "max_completion_tokens"),
        ({"tool_choice": "none"}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"stop": ["ok", ""]}, "stop.1"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
        ({"use_beam_search": True, "stop": "x"}, "stop"),
        ({"messages": [{"role": "", "content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"role": 7, "content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "messages.0.tool_call_id"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": ""}]}, "messages.0.content"),
        ({"model": 12}, "model"),
        ({"stop_token_ids": [-1]}, "stop_token_ids.0"),
        ({"stop_token_ids": [5, 2**31]}, "stop_token_ids.1"),
        ({"stop_token_ids": [2**64]}, "stop_token_ids.0"),
    ],
)
async def test_bad_field_is_400_naming_it(fields: dict, param: str) -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(**fields))
    error = assert_envelope(response, 400, param)
    assert error["type"] == "invalid_request_error"
    assert backend.requests == []


async def test_errors_quote_the_field_the_client_sent() -> None:
    # The alias is stored as max_tokens, but a client that never sent max_tokens must not read it.
    async with client_for(FakeBackend()) as client:
        too_few = await client.post("/v1/chat/completions", json=chat_body(max_completion_tokens=-1))
        too_many = await client.post("/v1/chat/completions", json=chat_body(max_completion_tokens=2, min_tokens=3))
        no_tools = await client.post("/v1/chat/completions", json=chat_body(tool_choice="auto"))
    assert "'max_completion_tokens'" in assert_envelope(too_few, 400)["message"]
    assert "max_tokens" not in assert_envelope(too_few, 400)["message"].replace("max_completion_tokens", "")
    assert "'max_completion_tokens'" in assert_envelope(too_many, 400, "min_tokens")["message"]
    assert assert_envelope(no_tools, 400)["message"] == (
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified."
    )


async def test_missing_model_and_messages() -> None:
    async with client_for(FakeBackend()) as client:
        no_model = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        no_messages = await client.post("/v1/chat/completions", json={"model": "tiny-chat"})
    assert_envelope(no_model, 400, "model")
    assert_envelope(no_messages, 400, "messages")


async def test_remote_media_is_refused_without_an_allow_list() -> None:
    # The default media policy fails closed (docs/media-security.md); tests/media covers the rest.
    content = [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "http://x.test/a.png"}},
    ]
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat_body(messages=[{"role": "user", "content": content}])
        )
    assert assert_envelope(response, 400, "messages.0.content.1.image_url")["code"] == "media_not_allowed"
    assert backend.requests == []


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe"])
async def test_malformed_body_is_400(raw: bytes) -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert_envelope(response, 400)


async def test_unknown_field_is_reported_in_header_by_default() -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat_body(frobnicate=1, zeta=True, user="u1", store=False)
        )
    assert response.status_code == 200
    assert response.headers["x-ignored-params"] == "frobnicate,zeta"  # harmless OpenAI fields not listed
    assert backend.requests[0].parameters == {}  # nothing unknown reaches the backend


async def test_parallel_tool_calls_reaches_the_backend_and_must_be_a_boolean() -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(parallel_tool_calls=False))
        assert response.status_code == 200 and "x-ignored-params" not in response.headers
        assert backend.requests[0].parameters == {"parallel_tool_calls": False}
        response = await client.post("/v1/chat/completions", json=chat_body(parallel_tool_calls="no"))
    assert_envelope(response, 400)
    assert response.json()["error"]["param"] == "parallel_tool_calls"


async def test_unknown_field_is_400_in_strict_mode() -> None:
    async with client_for(FakeBackend(), strict_params=True) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(frobnicate=1, user="u1"))
    error = assert_envelope(response, 400, "frobnicate")
    assert "frobnicate" in error["message"]


async def test_unknown_model_is_404() -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(model="gpt-4"))
    error = assert_envelope(response, 404, "model")
    assert error["code"] == "model_not_found"


async def test_validation_order_messages_before_params_before_model() -> None:
    async with client_for(FakeBackend()) as client:
        both = await client.post("/v1/chat/completions", json=chat_body(model="nope", messages=[], temperature=-1))
        params_then_model = await client.post("/v1/chat/completions", json=chat_body(model="nope", temperature=-1))
    assert_envelope(both, 400, "messages")
    assert_envelope(params_then_model, 400, "temperature")


async def test_unknown_route_and_wrong_method_use_the_envelope() -> None:
    async with client_for(FakeBackend()) as client:
        missing = await client.get("/v2/models")
        wrong = await client.get("/v1/chat/completions")
    assert assert_envelope(missing, 404)["code"] == "not_found"
    assert assert_envelope(wrong, 405)["code"] == "method_not_allowed"


async def test_body_over_limit_is_413() -> None:
    backend = FakeBackend()
    async with client_for(backend, max_body_bytes=1024) as client:
        declared = await client.post("/v1/chat/completions", json=chat_body(user="x" * 2000))

        async def chunks():
            for _ in range(10):
                yield b" " * 200

        chunked = await client.post("/v1/chat/completions", content=chunks())
        bad_length = await client.post(
            "/v1/chat/completions", content=b"{}", headers={"content-length": "-1", "content-type": "application/json"}
        )
    assert assert_envelope(declared, 413)["code"] == "request_too_large"
    assert assert_envelope(chunked, 413)["code"] == "request_too_large"
    assert_envelope(bad_length, 400)
    assert backend.requests == []


async def test_unexpected_exception_is_a_clean_500() -> None:
    def script(_req):
        raise RuntimeError("secret at /work/main/x.py 0xdeadbeefcafe")

    async with client_for(FakeBackend(script=script)) as client:
        response = await client.post("/v1/chat/completions", json=chat_body())
    error = assert_envelope(response, 500)
    assert error["message"] == "internal server error"
