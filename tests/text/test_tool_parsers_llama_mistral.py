"""The Llama 3.x JSON and Mistral ``[TOOL_CALLS]`` parsers on golden outputs, fed token by token
through the real detokenizer (and one character at a time), and their choice by ``auto``."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from test_tool_parsers import run

from python_backend.protocol.params import parse_parameters
from python_backend.text.output_formats import plan_output, resolve_formats
from python_backend.text.tool_parsers import ToolCall, make_tool_parser
from tests.fixtures.token_stream import token_deltas

LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LLAMA_TIME = '{"name": "get_time", "parameters": {"zone": "CET", "exact": true}}'
MISTRAL_LIST = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"zone": "CET"}}]'
MISTRAL_ID = re.compile(r"^[A-Za-z0-9]{9}$")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather"}},
    {"type": "function", "function": {"name": "get_time"}},
]


def parse(name: str, tok: Any, text: str | list[str], prefill: str = "") -> tuple[str, list[ToolCall], list[str]]:
    return run(make_tool_parser(name, frozenset(), prefill), token_deltas(tok, text))


def calls_of(calls: list[ToolCall]) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(
    "text",
    [LLAMA_CALL, f"  {LLAMA_CALL}", f"<|python_tag|>{LLAMA_CALL}", f"<|python_tag|> {LLAMA_CALL}"],
    ids=["bare", "leading-space", "python-tag", "python-tag-space"],
)
def test_llama_single_call(tiny_tokenizer: Any, text: str) -> None:
    content, calls, _ = parse("llama3_json", tiny_tokenizer, text)
    assert content == ""
    assert calls_of(calls) == [("get_weather", {"city": "Paris"})]
    assert re.fullmatch(r"call_[0-9a-f]{24}", calls[0].id)


@pytest.mark.parametrize("separator", ["; ", ";", "\n", ";\n<|python_tag|>"])
def test_llama_several_calls(tiny_tokenizer: Any, separator: str) -> None:
    content, calls, _ = parse("llama3_json", tiny_tokenizer, f"{LLAMA_CALL}{separator}{LLAMA_TIME}")
    assert content == ""
    assert calls_of(calls) == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET", "exact": True})]


def test_llama_arguments_spelling_and_quoted_arguments(tiny_tokenizer: Any) -> None:
    text = '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}'
    assert calls_of(parse("llama3_json", tiny_tokenizer, text)[1]) == [("get_weather", {"city": "Paris"})]


def test_llama_plain_answer_streams_at_once(tiny_tokenizer: Any) -> None:
    content, calls, released = parse("llama3_json", tiny_tokenizer, "The weather in Paris is sunny {really}.")
    assert calls == [] and content == "The weather in Paris is sunny {really}."
    assert released[0] == "The"  # nothing held back once the answer is not a call


def test_llama_python_tag_after_text_starts_a_call(tiny_tokenizer: Any) -> None:
    content, calls, _ = parse("llama3_json", tiny_tokenizer, f"Let me look.<|python_tag|>{LLAMA_CALL}")
    assert content == "Let me look." and [c.name for c in calls] == ["get_weather"]


@pytest.mark.parametrize(
    "text",
    ['{"city": "Paris"}', '{"name": 3, "parameters": {}}', '{"name": "f", "parameters": [1]}', '{"name": "f", oops}'],
)
def test_llama_json_that_is_not_a_call_is_content(tiny_tokenizer: Any, text: str) -> None:
    assert parse("llama3_json", tiny_tokenizer, text)[:2] == (text, [])


def test_llama_unfinished_call_is_content(tiny_tokenizer: Any) -> None:
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Par'
    assert parse("llama3_json", tiny_tokenizer, text)[:2] == (text, [])


def test_llama_text_after_a_call_is_content(tiny_tokenizer: Any) -> None:
    content, calls, _ = parse("llama3_json", tiny_tokenizer, f"{LLAMA_CALL} Done.")
    assert content == "Done." and len(calls) == 1


@pytest.mark.parametrize(
    ("prefill", "generated"),
    [
        ('{"name": "', 'get_weather", "parameters": {"city": "Paris"}}'),
        ('{"name": "get_weather", "parameters":', ' {"city": "Paris"}}'),
    ],
    ids=["required", "named"],
)
def test_llama_prefilled_call_is_completed_by_the_model(tiny_tokenizer: Any, prefill: str, generated: str) -> None:
    content, calls, _ = parse("llama3_json", tiny_tokenizer, generated, prefill)
    assert content == "" and calls_of(calls) == [("get_weather", {"city": "Paris"})]


def test_mistral_list_of_calls(tiny_tokenizer: Any) -> None:
    content, calls, _ = parse("mistral", tiny_tokenizer, MISTRAL_LIST)
    assert content == ""
    assert calls_of(calls) == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]
    assert all(MISTRAL_ID.match(c.id) for c in calls) and calls[0].id != calls[1].id


def test_mistral_name_args_form_and_text_before(tiny_tokenizer: Any) -> None:
    text = 'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'
    content, calls, _ = parse("mistral", tiny_tokenizer, text)
    assert content == "Checking."
    assert calls_of(calls) == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]


def test_mistral_single_object_and_parameters_spelling(tiny_tokenizer: Any) -> None:
    text = '[TOOL_CALLS] {"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert calls_of(parse("mistral", tiny_tokenizer, text)[1]) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(
    "text",
    [
        "[TOOL_CALLS] [1, 2]",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Par',
        "[TOOL_CALLS]get_weather[ARGS]nope",
        '[TOOL_CALLS] {"name": "f", "arguments": {]}',
    ],
    ids=["not-calls", "unfinished", "args-not-json", "bad-json"],
)
def test_mistral_what_is_not_a_call_is_content(tiny_tokenizer: Any, text: str) -> None:
    assert parse("mistral", tiny_tokenizer, text)[:2] == (text, [])


def test_mistral_holds_text_only_while_it_could_be_the_marker(tiny_tokenizer: Any) -> None:
    text = "Sunny [TOOL] no call [x]"
    content, calls, released = parse("mistral", tiny_tokenizer, text)
    assert content == text and calls == []
    first = token_deltas(tiny_tokenizer, text)[0]
    assert released[0] == first and not first.endswith("[")  # released as it came: not a marker start


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("llama3_json", f"Checking.\n<|python_tag|>{LLAMA_CALL}; {LLAMA_TIME}"),
        ("mistral", f"Checking.\n{MISTRAL_LIST}"),
        ("mistral", 'Checking.\n[TOOL_CALLS]get_weather[ARGS]{"a": "}"} [TOOL_CALLS]get_time[ARGS]{}'),
    ],
)
def test_one_character_at_a_time_gives_the_same_result(name: str, text: str) -> None:
    whole = run(make_tool_parser(name, frozenset()), [text])
    by_char = run(make_tool_parser(name, frozenset()), list(text))
    assert by_char[0] == whole[0] == "Checking.\n"
    assert [(c.name, c.arguments) for c in by_char[1]] == [(c.name, c.arguments) for c in whole[1]]
    assert len(whole[1]) == 2


class _Template:
    """A tokenizer as ``resolve_formats`` reads it: a chat template and a vocabulary."""

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def get_vocab(self) -> dict[str, int]:
        return {}


@pytest.mark.parametrize(
    ("template", "parser"),
    [
        (
            'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.',
            "llama3_json",
        ),
        ("{{- '<|python_tag|>' + tool_call.name }}", "llama3_json"),
        ("{{- '[AVAILABLE_TOOLS] ' + tools|tojson + '[/AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS] ' }}", "mistral"),
        ("{{ '<tool_call>' }} [TOOL_CALLS]", "hermes"),
        ("{{ messages }}", None),
    ],
    ids=["llama-instruction", "llama-python-tag", "mistral", "hermes-first", "none"],
)
def test_auto_picks_the_format_from_the_chat_template(template: str, parser: str | None) -> None:
    assert resolve_formats("auto", "none", _Template(template), "llama").tool_parser == parser  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("parser", "choice", "suffix"),
    [
        ("llama3_json", "required", '{"name": "'),
        ("llama3_json", {"type": "function", "function": {"name": "get_time"}}, '{"name": "get_time", "parameters":'),
        ("mistral", "required", "[TOOL_CALLS]"),
        (
            "mistral",
            {"type": "function", "function": {"name": "get_time"}},
            '[TOOL_CALLS][{"name": "get_time", "arguments":',
        ),
    ],
)
def test_forced_calls_prefill_the_format_s_call_start(parser: str, choice: Any, suffix: str) -> None:
    formats = resolve_formats(parser, "none", _Template(""), "llama")  # type: ignore[arg-type]
    plan, added = plan_output(formats, parse_parameters({"tools": TOOLS, "tool_choice": choice}), "prompt")
    assert added == suffix and plan.tool_prefill == suffix and plan.tool_parser == parser
    assert formats.keeps_special_tokens_for_tools == (parser == "mistral")
