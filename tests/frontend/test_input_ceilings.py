"""The frontend holds every text bound for the tokenizer to the input ceiling (4 MiB characters)
and every value the chat template renders to the nesting ceiling (64 levels), before anything
goes to the model: 400s naming the field, with the ceiling in the message. A body nested past
the JSON parser's own limit is a 400 that says so."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from frontend_fakes import MODEL, FakeBackend, chat_body, client_for

from python_backend.protocol.input_limits import MAX_INPUT_CHARS, MAX_NESTING_DEPTH

OVER = MAX_INPUT_CHARS + 1
FAST_S = 2.0  # a refusal is a few parses of the body; tokenizing 4 MiB would take far longer


def deep_schema(properties: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(properties):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def tools_with(parameters: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


async def _post(path: str, body: dict[str, Any] | str) -> tuple[Any, FakeBackend, float]:
    backend = FakeBackend()
    content = body if isinstance(body, str) else json.dumps(body)
    started = time.monotonic()
    async with client_for(backend) as client:
        response = await client.post(path, content=content, headers={"content-type": "application/json"})
    return response, backend, time.monotonic() - started


def _refused(response: Any, param: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    return error


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"model": MODEL, "prompt": "x" * OVER}, "prompt"),
        ("/detokenize", {"model": MODEL, "tokens": [123456] * (MAX_INPUT_CHARS // 8 + 1)}, "tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x" * OVER}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": ["x" * (OVER // 2), "y" * (OVER // 2)]}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [123456] * (MAX_INPUT_CHARS // 8 + 1)}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [[1] * (MAX_INPUT_CHARS // 3 + 1)]}, "prompt"),
        ("/v1/chat/completions", chat_body(tools=tools_with({"d": "x" * OVER})), "tools.0.function.parameters"),
        (
            "/tokenize",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": tools_with({"d": "x" * OVER})},
            "tools.0.function.parameters",
        ),
    ],
)
async def test_text_past_the_input_ceiling_is_a_400_naming_the_field_at_once(
    path: str, body: dict[str, Any], param: str
) -> None:
    response, backend, took = await _post(path, body)
    error = _refused(response, param)
    assert str(MAX_INPUT_CHARS) in error["message"] and "characters" in error["message"]
    assert backend.queries == [] and backend.requests == []  # nothing reached the model
    assert took < FAST_S


async def test_text_at_the_ceiling_still_reaches_the_model() -> None:
    response, backend, _ = await _post("/tokenize", {"model": MODEL, "prompt": "x" * 1000})
    assert response.status_code == 200 and len(backend.queries) == 1


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", chat_body(tools=tools_with(deep_schema(450))), "tools.0.function.parameters"),
        (
            "/tokenize",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": tools_with(deep_schema(40))},
            "tools.0.function.parameters",
        ),
        (
            "/v1/chat/completions",
            chat_body(
                messages=[
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "[" * 450 + "]" * 450},
                            }
                        ],
                    },
                ]
            ),
            "messages.1.tool_calls.0.function.arguments",
        ),
    ],
)
async def test_values_nested_past_the_ceiling_are_a_400_naming_them(
    path: str, body: dict[str, Any], param: str
) -> None:
    response, backend, _ = await _post(path, body)
    error = _refused(response, param)
    assert f"deeper than {MAX_NESTING_DEPTH} levels" in error["message"]
    assert backend.queries == [] and backend.requests == []


async def test_a_tool_schema_within_the_ceiling_reaches_the_model() -> None:
    response, backend, _ = await _post("/v1/chat/completions", chat_body(tools=tools_with(deep_schema(20))))
    assert response.status_code == 200 and len(backend.requests) == 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"])
async def test_a_body_nested_past_the_json_parsers_limit_says_so(path: str) -> None:
    body = '{"model": "m", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response, _, _ = await _post(path, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and "nested deeper than" in error["message"]
