"""Tool calls and reasoning through tritonserver and the frontend, with the openai client.

The model is the tiny one trained at test time to answer one question with a ``get_weather``
call and another with ``<think>`` reasoning (tests/fixtures/trained_models.py).
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from tests.e2e.conftest import TritonHandle
from tests.e2e.test_chat_e2e import error_body
from tests.fixtures.trained_models import ANSWER, THINK_QUESTION, THOUGHT, TOOL_QUESTION, WEATHER_TOOL

# The golden tool is a function tool in the OpenAI shape; the fixture keeps it a plain dict
# because the backend's tests and the chat template take it as one.
WEATHER_TOOL_PARAM = cast(ChatCompletionFunctionToolParam, WEATHER_TOOL)


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def ask(question: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": question}]


# parallel_tool_calls=False reaches the model (which would drop a second call: unit-tested).
@pytest.mark.parametrize("parallel", [openai.NOT_GIVEN, False], ids=["default", "no-parallel-calls"])
def test_tool_call_non_streaming(trained_triton_server: TritonHandle, trained_frontend_url: str, parallel: Any) -> None:
    reply = client_for(trained_frontend_url).chat.completions.create(
        model=trained_triton_server.served_model_name,
        messages=ask(TOOL_QUESTION),
        tools=[WEATHER_TOOL_PARAM],
        temperature=0,
        parallel_tool_calls=parallel,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    assert re.fullmatch(r"call_[0-9a-f]{24}", calls[0].id) and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert not choice.message.content
    assert reply.model_dump()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_tool_call_streaming(trained_triton_server: TritonHandle, trained_frontend_url: str) -> None:
    chunks = list(
        client_for(trained_frontend_url).chat.completions.create(
            model=trained_triton_server.served_model_name,
            messages=ask(TOOL_QUESTION),
            tools=[WEATHER_TOOL_PARAM],
            tool_choice="required",
            temperature=0,
            stream=True,
        )
    )
    merged = streamed_tool_calls(chunks)
    assert list(merged) == [0]
    assert merged[0]["name"] == "get_weather" and merged[0]["id"].startswith("call_")
    assert json.loads(merged[0]["arguments"]) == {"city": "Paris"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def streamed_tool_calls(chunks: list[Any]) -> dict[int, dict[str, str]]:
    """Each streamed call's id, name and arguments, put back together from its pieces by index."""
    merged: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = merged.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += piece.id or ""
            call["name"] += (piece.function.name if piece.function else None) or ""
            call["arguments"] += (piece.function.arguments if piece.function else None) or ""
    return merged


def reasoning_of(model: Any) -> str:
    return str((model.model_extra or {}).get("reasoning_content") or "")


def test_reasoning_content(trained_triton_server: TritonHandle, trained_frontend_url: str) -> None:
    client = client_for(trained_frontend_url)
    args: dict[str, Any] = {
        "model": trained_triton_server.served_model_name,
        "messages": ask(THINK_QUESTION),
        "temperature": 0,
    }
    reply = client.chat.completions.create(**args)
    message = reply.choices[0].message
    assert (reasoning_of(message), message.content) == (THOUGHT, ANSWER)
    assert reply.choices[0].finish_reason == "stop"
    reasoning_tokens = reply.model_dump()["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert 0 < reasoning_tokens < reply.usage.completion_tokens

    chunks = list(client.chat.completions.create(stream=True, **args))
    assert "".join(reasoning_of(c.choices[0].delta) for c in chunks) == THOUGHT
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ANSWER
    usage = chunks[-1].model_dump()["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == reasoning_tokens


def test_stop_strings_are_refused_while_reasoning_is_parsed(
    trained_triton_server: TritonHandle, trained_frontend_url: str
) -> None:
    client = client_for(trained_frontend_url)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=trained_triton_server.served_model_name, messages=ask(THINK_QUESTION), stop=["four"]
        )
    assert error_body(caught.value)["param"] == "stop"
    reply = client.chat.completions.create(
        model=trained_triton_server.served_model_name,
        messages=ask(THINK_QUESTION),
        stop=["four"],
        max_tokens=20,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert not reasoning_of(reply.choices[0].message)
