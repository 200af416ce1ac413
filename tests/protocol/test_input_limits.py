"""The input ceilings: every text bound for the tokenizer is at most 4 MiB characters, and every
value the chat template renders nests at most 64 levels; refusals are 400s naming the field,
with the ceiling in the message, at both edges."""

from __future__ import annotations

import json
from typing import Any

import pytest

from python_backend.protocol import contract
from python_backend.protocol.errors import ContractError, ErrorInfo
from python_backend.protocol.input_limits import (
    MAX_INPUT_CHARS,
    MAX_NESTING_DEPTH,
    check_input_size,
    check_nesting,
    check_tools,
)
from python_backend.protocol.messages import validate_messages, validate_tensor_messages
from python_backend.protocol.tokenize import DetokenizeQuery, check_tokens, read_query

OVER = MAX_INPUT_CHARS + 1


def nested(levels: int) -> Any:
    """A JSON schema whose arrays and objects nest ``levels`` deep (two per property level)."""
    value: Any = {"type": "string"}
    depth = 1
    while depth + 2 <= levels:
        value = {"type": "object", "properties": {"a": value}}
        depth += 2
    return [value] if depth < levels else value


def refusal(check: Any, *args: Any) -> ErrorInfo:
    with pytest.raises(ContractError) as caught:
        check(*args)
    assert caught.value.info.status == 400 and caught.value.info.type == "invalid_request_error"
    return caught.value.info


def tool(parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def test_the_nesting_helper_counts_levels_of_arrays_and_objects() -> None:
    assert json.dumps(nested(3)) == '{"type": "object", "properties": {"a": {"type": "string"}}}'
    assert json.dumps(nested(4)) == '[{"type": "object", "properties": {"a": {"type": "string"}}}]'
    within: list[Any] = ["text", 5, None, [], {}, [[[]]], nested(MAX_NESTING_DEPTH)]
    for value in within:
        check_nesting(value, "x")


def test_one_level_past_the_nesting_ceiling_is_a_400_naming_the_field() -> None:
    check_nesting(nested(MAX_NESTING_DEPTH), "tools.0.function.parameters")
    info = refusal(check_nesting, nested(MAX_NESTING_DEPTH + 1), "tools.0.function.parameters")
    assert info.param == "tools.0.function.parameters"
    assert f"deeper than {MAX_NESTING_DEPTH} levels" in info.message


def test_a_string_counts_its_characters_and_a_list_its_json_text() -> None:
    check_input_size("é" * MAX_INPUT_CHARS, "prompt")  # characters, not bytes
    info = refusal(check_input_size, "x" * OVER, "prompt")
    assert info.param == "prompt"
    assert f"is {OVER} characters" in info.message and f"limit is {MAX_INPUT_CHARS}" in info.message
    ids = [100000] * (MAX_INPUT_CHARS // 8 + 1)  # "100000, " per id
    assert refusal(check_input_size, ids, "prompt").param == "prompt"


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([tool(nested(800))], "tools.0.function.parameters"),  # 400 levels of properties
        ([tool({}), tool(nested(MAX_NESTING_DEPTH + 1))], "tools.1.function.parameters"),
        ([{"type": "function", "function": {"name": "f"}, "extra": nested(100)}], "tools.0.extra"),
        ([tool({"description": "x" * OVER})], "tools.0.function.parameters"),
        (
            [tool({"d": "x" * (MAX_INPUT_CHARS // 2)}), tool({"d": "x" * (MAX_INPUT_CHARS // 2)})],
            "tools.1.function.parameters",
        ),
    ],
)
def test_tools_past_a_ceiling_name_the_field_at_fault(tools: list[Any], param: str) -> None:
    info = refusal(check_tools, tools)
    assert info.param == param


def test_tools_within_the_ceilings_pass() -> None:
    check_tools([tool(nested(MAX_NESTING_DEPTH)), tool({"d": "x" * 1000})])
    check_tools(None)


def _arguments(value: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": value}}
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}]


@pytest.mark.parametrize("levels", [MAX_NESTING_DEPTH + 1, 900, 5000])  # 5000: past the JSON parser's own limit
@pytest.mark.parametrize("validate", [validate_messages, validate_tensor_messages])
def test_deep_tool_call_arguments_are_a_400_naming_them(levels: int, validate: Any) -> None:
    deep = "[" * levels + "]" * levels
    info = refusal(validate, _arguments(deep))
    assert info.param == "messages.1.tool_calls.0.function.arguments"
    assert f"deeper than {MAX_NESTING_DEPTH} levels" in info.message
    validate(_arguments(json.dumps(nested(MAX_NESTING_DEPTH))))


def test_a_deep_message_is_a_400_naming_it() -> None:
    messages = [{"role": "user", "content": "hi", "metadata": nested(200)}]
    assert refusal(validate_messages, messages).param == "messages.0"


def test_messages_keep_their_4_mib_ceiling() -> None:
    info = refusal(validate_messages, [{"role": "user", "content": "x" * MAX_INPUT_CHARS}])
    assert info.param == "messages" and str(MAX_INPUT_CHARS) in info.message


def test_a_tokenize_prompt_past_the_ceiling_is_refused_by_the_model_too() -> None:
    info = refusal(read_query, json.dumps({"prompt": "x" * OVER}))
    assert info.param == "prompt" and str(MAX_INPUT_CHARS) in info.message
    assert read_query(json.dumps({"prompt": "x" * 1000}))


def test_tokenize_tools_are_held_to_the_ceilings_by_the_model() -> None:
    query = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool(nested(800))]}
    assert refusal(read_query, json.dumps(query)).param == "tools.0.function.parameters"


def test_detokenize_ids_are_held_to_the_same_ceiling() -> None:
    many = [123456] * (MAX_INPUT_CHARS // 8 + 1)  # fewer ids than the old limit of 2**20, but 4 MiB of JSON
    assert refusal(check_tokens, many).param == "tokens"
    assert refusal(read_query, DetokenizeQuery(many).to_wire()).param == "tokens"
    assert check_tokens([1, 2, 3]) == [1, 2, 3]


def test_a_tensor_nested_past_the_json_parsers_limit_is_a_400_naming_it() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    info = refusal(read_query, deep)
    assert info.param == "tokenize"
    info = refusal(contract.read_json, contract.bytes_tensor(deep), contract.MESSAGES)
    assert info.param == contract.MESSAGES
