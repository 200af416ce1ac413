"""The Llama 3.x JSON and Mistral ``[TOOL_CALLS]`` tool-call formats through the real tritonserver
and the frontend, with the ``openai`` client: the tiny models trained to call ``get_weather`` in
each format (tests/fixtures/trained_tool_formats.py) answer with ``tool_calls``, streamed and not."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import _frontend_values, _run_frontend, _stop_frontends, e2e_settings, serving
from tests.e2e.test_tools_reasoning_e2e import WEATHER_TOOL_PARAM, ask, client_for, streamed_tool_calls
from tests.fixtures.trained_models import TOOL_QUESTION
from tests.fixtures.trained_tool_formats import HELLO_QUESTION, HELLO_REPLY, build_tool_format_model

# Training the two models takes minutes of CPU, as in tests/text/test_trained_tool_formats.py.
pytestmark = pytest.mark.slow

CALL_IDS = {"llama3_json": re.compile(r"call_[0-9a-f]{24}"), "mistral": re.compile(r"[A-Za-z0-9]{9}")}


@pytest.fixture(scope="module", params=sorted(CALL_IDS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(format, served model name, frontend URL) for a tritonserver serving that format's model."""
    name: str = request.param
    work = tmp_path_factory.mktemp(f"tool-format-{name}")
    # reasoning_parser none: the format alone decides (the tool parser stays auto).
    settings = e2e_settings(
        build_tool_format_model(work, name), f"tiny-{name}", max_iter_times=256, reasoning_parser="none"
    )
    with serving(settings, work) as triton:
        frontends = [_run_frontend(_frontend_values(triton, {}))]
        try:
            yield name, settings.served_model_name, frontends[0].url
        finally:
            _stop_frontends(frontends)


def test_the_call_comes_back_as_tool_calls(served: tuple[str, str, str]) -> None:
    name, model, url = served
    reply = client_for(url).chat.completions.create(
        model=model, messages=ask(TOOL_QUESTION), tools=[WEATHER_TOOL_PARAM], temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    assert CALL_IDS[name].fullmatch(calls[0].id) and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert not choice.message.content


def test_the_streamed_call_merges_into_arguments_that_parse(served: tuple[str, str, str]) -> None:
    name, model, url = served
    chunks = list(
        client_for(url).chat.completions.create(
            model=model, messages=ask(TOOL_QUESTION), tools=[WEATHER_TOOL_PARAM], temperature=0, stream=True
        )
    )
    merged = streamed_tool_calls(chunks)
    assert list(merged) == [0]
    assert CALL_IDS[name].fullmatch(merged[0]["id"]) and merged[0]["name"] == "get_weather"
    assert json.loads(merged[0]["arguments"]) == {"city": "Paris"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_a_plain_answer_stays_content(served: tuple[str, str, str], stream: bool) -> None:
    _, model, url = served
    args: dict[str, Any] = {"model": model, "messages": ask(HELLO_QUESTION), "tools": [WEATHER_TOOL_PARAM]}
    client = client_for(url)
    if stream:
        chunks = list(client.chat.completions.create(temperature=0, stream=True, **args))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    else:
        message = client.chat.completions.create(temperature=0, **args).choices[0].message
        text = message.content or ""
        assert not message.tool_calls
    assert text == HELLO_REPLY
