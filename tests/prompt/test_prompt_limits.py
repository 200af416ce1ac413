"""The model's own checks before any work on a prompt: each prompt form under the input ceiling,
tools under the nesting and size ceilings before the chat template runs, and whatever the
template still fails on is a 400 naming ``messages`` with one log line and no traceback."""

from __future__ import annotations

import copy
import json
import logging
import time
from typing import Any

import numpy as np
import pytest

from python_backend.prompt.chat_template import render_prompt_text
from python_backend.prompt.inputs import decode_request
from python_backend.protocol import contract
from python_backend.protocol.errors import ContractError, ErrorInfo
from python_backend.protocol.input_limits import MAX_INPUT_CHARS, MAX_NESTING_DEPTH
from python_backend.protocol.params import parse_parameters

HELLO = [{"role": "user", "content": "hello"}]
OVER = MAX_INPUT_CHARS + 1


def deep_schema(properties: int) -> dict[str, Any]:
    """A tool's parameters nested ``properties`` levels of properties deep (as the issue sent)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(properties):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def tools_of(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]}


def refusal(call: Any) -> ErrorInfo:
    with pytest.raises(ContractError) as caught:
        call()
    assert (caught.value.info.status, caught.value.info.type) == (400, "invalid_request_error")
    return caught.value.info


def test_a_tool_schema_450_levels_deep_is_a_400_naming_it(tiny_tokenizer: Any) -> None:
    params = parse_parameters(tools_of(deep_schema(450)))
    info = refusal(lambda: render_prompt_text(tiny_tokenizer, HELLO, params))
    assert info.param == "tools.0.function.parameters"
    assert f"deeper than {MAX_NESTING_DEPTH} levels" in info.message


def test_a_tool_schema_within_the_ceiling_is_rendered(tiny_tokenizer: Any) -> None:
    params = parse_parameters(tools_of(deep_schema(MAX_NESTING_DEPTH // 2 - 1)))
    text = render_prompt_text(tiny_tokenizer, HELLO, params)
    assert '"properties"' in text and text.endswith("<|im_start|>assistant\n")


def test_tools_past_the_size_ceiling_are_a_400_naming_the_schema(tiny_tokenizer: Any) -> None:
    params = parse_parameters(tools_of({"description": "x" * OVER}))
    info = refusal(lambda: render_prompt_text(tiny_tokenizer, HELLO, params))
    assert info.param == "tools.0.function.parameters" and str(MAX_INPUT_CHARS) in info.message


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "RecursionError"),
        ("{{ messages[0].content + 1 }}", "TypeError"),
        ("{{ messages[0].content.missing.deeper }}", "UndefinedError"),
        ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    ],
)
def test_a_template_that_fails_is_a_400_naming_messages_and_one_log_line(
    tiny_tokenizer: Any, caplog: pytest.LogCaptureFixture, template: str, error: str
) -> None:
    failing = copy.copy(tiny_tokenizer)  # the session's tokenizer keeps its own template
    failing.chat_template = template
    with caplog.at_level(logging.INFO):
        info = refusal(lambda: render_prompt_text(failing, HELLO, parse_parameters({})))
    assert info.param == "messages" and "chat template" in info.message
    assert len(caplog.records) == 1
    record = caplog.records[0]
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert error in record.getMessage() and "\n" not in record.getMessage()


def _refused(found: dict[str, Any], tokenizer: Any) -> ErrorInfo:
    return refusal(lambda: decode_request(found.get, tokenizer, frozenset()))


def test_a_text_input_past_the_ceiling_is_refused_before_tokenizing(tiny_tokenizer: Any) -> None:
    started = time.monotonic()
    info = _refused({contract.TEXT_INPUT: contract.bytes_tensor("word " * (OVER // 5 + 1))}, tiny_tokenizer)
    assert info.param == contract.TEXT_INPUT and str(MAX_INPUT_CHARS) in info.message
    assert time.monotonic() - started < 2.0  # tokenizing 4 MiB takes several times that


def test_prompt_token_ids_past_the_ceiling_are_refused(tiny_tokenizer: Any) -> None:
    ids = np.full(MAX_INPUT_CHARS // 3 + 1, 1, dtype=np.int32)  # "1, " per id
    info = _refused({contract.PROMPT_TOKEN_IDS: ids}, tiny_tokenizer)
    assert info.param == contract.PROMPT_TOKEN_IDS


def test_deep_tool_call_arguments_in_the_messages_tensor_are_a_400_naming_them(tiny_tokenizer: Any) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 450 + "]" * 450}}
    messages = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [call]}]
    info = _refused({contract.MESSAGES: contract.bytes_tensor(json.dumps(messages))}, tiny_tokenizer)
    assert info.param == "messages.1.tool_calls.0.function.arguments"
