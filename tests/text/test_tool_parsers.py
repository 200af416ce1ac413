"""Tool-call parsers on golden model outputs, fed token by token through the real detokenizer."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from python_backend.text.tool_parsers import ParserOutput, ToolCall, ToolParser, make_tool_parser
from tests.fixtures.token_stream import token_deltas

CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")
WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET", "exact": true}}\n</tool_call>'


def run(parser: ToolParser, deltas: list[str]) -> tuple[str, list[ToolCall], list[str]]:
    """Feed every delta; return all content, all calls and the content released by each feed."""
    total = ParserOutput()
    released = []
    for delta in deltas:
        out = parser.feed(delta)
        released.append(out.content)
        total.extend(out)
    total.extend(parser.finish())
    return total.content, total.calls, released


def hermes(tok: Any, text: str | list[str], prefill: str = "") -> tuple[str, list[ToolCall], list[str]]:
    return run(make_tool_parser("hermes", frozenset(), prefill), token_deltas(tok, text))


def args(call: ToolCall) -> Any:
    return json.loads(call.arguments)


def test_hermes_single_call(tiny_tokenizer: Any) -> None:
    content, calls, _ = hermes(tiny_tokenizer, WEATHER)
    assert content == ""
    assert [(c.name, args(c)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert CALL_ID.match(calls[0].id)
    assert calls[0].delta_form(0) == {
        "index": 0,
        "id": calls[0].id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }


def test_hermes_several_calls_with_text_around_them(tiny_tokenizer: Any) -> None:
    text = f"Let me check both.\n{WEATHER}\n{TIME}\nDone."
    content, calls, _ = hermes(tiny_tokenizer, text)
    assert content == "Let me check both.\nDone."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert args(calls[1]) == {"zone": "CET", "exact": True}
    assert len({c.id for c in calls}) == 2


def test_hermes_malformed_json_is_content_and_later_calls_still_parse(tiny_tokenizer: Any) -> None:
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'
    content, calls, _ = hermes(tiny_tokenizer, f"{bad}\n{WEATHER}")
    assert content == bad + "\n"
    assert [c.name for c in calls] == ["get_weather"]


@pytest.mark.parametrize(
    "body",
    [
        '["get_weather", {"city": "Paris"}]',  # JSON, but not an object
        '{"arguments": {"city": "Paris"}}',  # no name
        '{"name": "get_weather", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "get_weather", "arguments": "not json"}',
    ],
)
def test_hermes_bodies_that_are_not_calls_are_content(tiny_tokenizer: Any, body: str) -> None:
    text = f"<tool_call>\n{body}\n</tool_call>"
    assert hermes(tiny_tokenizer, text)[:2] == (text, [])


def test_hermes_accepts_parameters_key_and_quoted_arguments(tiny_tokenizer: Any) -> None:
    text = (
        '<tool_call>{"name": "a", "parameters": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": \\"é\\"}"}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>'
    )
    _, calls, _ = hermes(tiny_tokenizer, text)
    assert [(c.name, args(c)) for c in calls] == [("a", {"x": 1}), ("b", {"y": "é"}), ("c", {})]


def test_hermes_tag_split_over_tokens_never_leaks(tiny_tokenizer: Any) -> None:
    body = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    content, calls, released = hermes(tiny_tokenizer, ["Sure. <", "tool", "_call>", body, "</", "tool_call>"])
    assert content == "Sure. "
    assert [c.name for c in calls] == ["get_weather"]
    assert all("<" not in piece for piece in released)


def test_hermes_holds_text_only_while_it_could_be_the_tag(tiny_tokenizer: Any) -> None:
    parser = make_tool_parser("hermes", frozenset())
    assert parser.feed("a <").content == "a "
    assert parser.feed("tool_c").content == ""
    assert parser.feed("x").content == "<tool_cx"  # not the tag after all: released at once
    assert parser.feed(" b").content == " b"
    assert parser.finish().content == ""


def test_hermes_unclosed_call_at_the_end(tiny_tokenizer: Any) -> None:
    complete = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert [c.name for c in hermes(tiny_tokenizer, complete)[1]] == ["get_weather"]
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    assert hermes(tiny_tokenizer, cut)[:2] == (cut, [])


@pytest.mark.parametrize(
    ("prefill", "generated"),
    [
        ("<tool_call>\n", '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
        ('<tool_call>\n{"name": "get_weather", "arguments":', '{"city": "Paris"}}\n</tool_call>'),
    ],
)
def test_hermes_prefilled_call_is_completed_by_the_model(tiny_tokenizer: Any, prefill: str, generated: str) -> None:
    content, calls, _ = hermes(tiny_tokenizer, generated, prefill=prefill)
    assert content == ""
    assert [(c.name, args(c)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_hermes_prefilled_call_gone_wrong_is_shown_whole(tiny_tokenizer: Any) -> None:
    prefill = '<tool_call>\n{"name": "get_weather", "arguments":'
    content, calls, _ = hermes(tiny_tokenizer, "sorry", prefill=prefill)
    assert (content, calls) == (prefill + "sorry", [])


def glm(tok: Any, text: str | list[str], prefill: str = "") -> tuple[str, list[ToolCall], list[str]]:
    parser = make_tool_parser("chatglm3", frozenset({"get_weather", "get_time"}), prefill)
    return run(parser, token_deltas(tok, text))


def test_chatglm3_python_style_call(tiny_tokenizer: Any) -> None:
    text = 'get_weather\n```python\ntool_call(city="Paris", days=2, units=None, extra={"a": [1, 2.5]})\n```'
    content, calls, _ = glm(tiny_tokenizer, text)
    assert content == ""
    assert [(c.name, args(c)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2, "units": None, "extra": {"a": [1, 2.5]}})
    ]
    assert CALL_ID.match(calls[0].id)


def test_chatglm3_json_parameters_line(tiny_tokenizer: Any) -> None:
    _, calls, _ = glm(tiny_tokenizer, 'get_time\n{"zone": "CET"}')
    assert [(c.name, args(c)) for c in calls] == [("get_time", {"zone": "CET"})]


def test_chatglm3_plain_answer_and_text_before_a_call(tiny_tokenizer: Any) -> None:
    assert glm(tiny_tokenizer, "\n Hello, I am ChatGLM3.")[:2] == ("Hello, I am ChatGLM3.", [])
    text = "\nOkay, let me look it up.\n<|assistant|>get_weather\n```python\ntool_call(city='Beijing')\n```"
    content, calls, _ = glm(tiny_tokenizer, text)
    assert content == "Okay, let me look it up.\n"
    assert [(c.name, args(c)) for c in calls] == [("get_weather", {"city": "Beijing"})]


def test_chatglm3_two_calls_in_one_answer(tiny_tokenizer: Any) -> None:
    text = "get_weather\n```python\ntool_call(city='A')\n```<|assistant|>get_time\n```python\ntool_call()\n```"
    _, calls, _ = glm(tiny_tokenizer, text)
    assert [(c.name, args(c)) for c in calls] == [("get_weather", {"city": "A"}), ("get_time", {})]


@pytest.mark.parametrize(
    "body",
    [
        "```python\ntool_call(city=__import__('os').system('echo pwned'))\n```",  # never evaluated
        "```python\ntool_call('Paris')\n```",  # positional
        "```python\ntool_call(city=\n```",  # syntax error
        '{"city": Paris}',  # bad JSON
    ],
)
def test_chatglm3_malformed_calls_are_content(tiny_tokenizer: Any, body: str) -> None:
    assert glm(tiny_tokenizer, f"get_weather\n{body}")[:2] == (f"get_weather\n{body}", [])


def test_chatglm3_other_metadata_is_content(tiny_tokenizer: Any) -> None:
    text = "interpreter\n```python\nprint(1)\n```"
    content, calls, released = glm(tiny_tokenizer, text)
    assert (content, calls) == (text, [])
    assert released[0] == "interpreter"[: len(released[0])]  # released as soon as it is no tool name


def test_chatglm3_named_prefill(tiny_tokenizer: Any) -> None:
    _, calls, _ = glm(tiny_tokenizer, "```python\ntool_call(city='Paris')\n```", prefill="get_weather\n")
    assert [(c.name, args(c)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_unknown_parser_name() -> None:
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        make_tool_parser("llama3", frozenset())


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", f"Checking.\n{WEATHER}\n{TIME}"),
        (
            "chatglm3",
            "\nChecking.\n<|assistant|>get_weather\n```python\ntool_call(city='A')\n```<|assistant|>get_time\n{}",
        ),
    ],
)
def test_one_character_at_a_time_gives_the_same_result(name: str, text: str) -> None:
    """Tags split at every possible point (and the parsers' no-rescan offsets) change nothing."""
    names = frozenset({"get_weather", "get_time"})
    whole = run(make_tool_parser(name, names), [text])
    by_char = run(make_tool_parser(name, names), list(text))
    assert by_char[0] == whole[0] == "Checking.\n"
    assert [(c.name, c.arguments) for c in by_char[1]] == [(c.name, c.arguments) for c in whole[1]]
    assert len(whole[1]) == 2
