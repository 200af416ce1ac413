"""Input no server can carry: lone surrogates in any string are a 400 naming the field, and odd
unknown field names come back in ``x-ignored-params`` escaped, never as a broken response."""

from __future__ import annotations

import json
from urllib.parse import unquote

import pytest
from frontend_fakes import FakeBackend, chat_body, client_for
from test_request_errors import assert_envelope

from openai_frontend.http.headers import MAX_IGNORED_HEADER_BYTES, header_safe, ignored_params_headers

SURROGATE = "\\ud800"  # as written in JSON: the escape of a lone high surrogate


def raw_body(text: str) -> bytes:
    """A request body from JSON text (json.dumps cannot write a lone surrogate escape for us)."""
    return text.encode("utf-8")


def with_surrogate(field: str) -> bytes:
    base = json.dumps(chat_body())[:-1]  # without the closing brace
    bodies = {
        "messages.0.content": f'{{"model": "tiny-chat", "messages": [{{"role": "user", "content": "a{SURROGATE}b"}}]}}',
        "model": f'{{"model": "tiny{SURROGATE}", "messages": [{{"role": "user", "content": "x"}}]}}',
        "stop.1": base + f', "stop": ["ok", "{SURROGATE}"]}}',
        "tools.0.function.name": base
        + f', "tools": [{{"type": "function", "function": {{"name": "f{SURROGATE}", "parameters": {{}}}}}}]}}',
        "user": base + ', "user": "\\udfff"}',
        "frob\\ud800": base + f', "frob{SURROGATE}": 1}}',
    }
    return raw_body(bodies[field])


@pytest.mark.parametrize("mode", ["vllm", "openai"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "field", ["messages.0.content", "model", "stop.1", "tools.0.function.name", "user", "frob\\ud800"]
)
async def test_a_lone_surrogate_is_a_400_naming_the_field(field: str, stream: bool, mode: str) -> None:
    backend = FakeBackend()
    body = with_surrogate(field)
    if stream:
        body = body[:-1] + b', "stream": true}'
    async with client_for(backend, openai_mode=mode) as client:
        response = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    error = assert_envelope(response, 400, field)
    assert "Unicode" in error["message"]
    assert backend.requests == []


async def test_a_raw_utf8_encoded_surrogate_is_refused_too() -> None:
    body = b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert_envelope(response, 400, "messages.0.content")


async def test_a_surrogate_pair_is_one_valid_character() -> None:
    body = raw_body('{"model": "tiny-chat", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert backend.requests[0].messages[-1]["content"] == "\N{GRINNING FACE}"


ODD_NAMES = [
    "\N{GRINNING FACE}",
    "caf\u00e9",
    "a\r\nx-injected: 1",
    "nul\x00",
    "del\x7f",
    "tab\tbell\x07",
    "a,b",
    "50%",
]


@pytest.mark.parametrize("name", ODD_NAMES)
async def test_an_odd_unknown_field_name_comes_back_escaped(name: str) -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(**{name: 1, "zeta": 2}))
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "chat.completion"
    header = response.headers["x-ignored-params"]
    assert all(0x21 <= ord(char) < 0x7F for char in header)
    assert [unquote(part) for part in header.split(",")] == sorted([name, "zeta"])
    assert "x-injected" not in response.headers
    assert "x-ignored-params-dropped" not in response.headers


async def test_odd_names_in_a_stream_keep_the_stream_whole() -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True, **{"\r\n": 1, "\x00": 2}))
    assert response.status_code == 200
    assert response.headers["x-ignored-params"] == "%00,%0D%0A"
    assert response.text.rstrip().endswith("data: [DONE]")


async def test_too_many_unknown_names_are_counted_as_dropped() -> None:
    names = {f"field_{i:04d}": i for i in range(1000)}
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(**names))
    assert response.status_code == 200
    listed = response.headers["x-ignored-params"].split(",")
    assert len(response.headers["x-ignored-params"]) <= MAX_IGNORED_HEADER_BYTES
    assert listed == sorted(names)[: len(listed)]
    assert int(response.headers["x-ignored-params-dropped"]) == 1000 - len(listed) > 0


def test_header_values_hold_only_visible_ascii() -> None:
    assert header_safe("plain_name-1.x") == "plain_name-1.x"
    assert header_safe("caf\u00e9 x") == "caf%C3%A9%20x"
    assert ignored_params_headers([]) == {}
    assert ignored_params_headers(["x" * (MAX_IGNORED_HEADER_BYTES + 1)]) == {"x-ignored-params-dropped": "1"}
