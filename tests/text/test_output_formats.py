"""Per-model format choice, per-request output plans (prefill, reasoning mode, exclusions), and
the rendered prompt of a conversation with tool calls."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from python_backend.prompt.chat_template import render_prompt_text
from python_backend.prompt.inputs import decode_request
from python_backend.protocol import contract
from python_backend.protocol.errors import ContractError
from python_backend.protocol.params import parse_parameters
from python_backend.protocol.settings import EngineSettings, SettingsError
from python_backend.text.output_formats import ModelFormats, plan_output, resolve_formats
from python_backend.text.output_plan import REASONING_DETECT, REASONING_FORCED, REASONING_OFF, OutputPipeline


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


TOOLS = [tool("get_weather"), tool("get_time")]
QWEN = ModelFormats(tool_parser="hermes", reasoning=True)
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def word_tokenizer(chat_template: str | dict[str, str], vocab: dict[str, int]) -> PreTrainedTokenizerFast:
    """A real tokenizer with just the template and vocabulary that format detection reads."""
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")))
    tokenizer.chat_template = chat_template
    return tokenizer


def test_auto_formats_come_from_the_tokenizer(tiny_tokenizer: Any) -> None:
    assert resolve_formats("auto", "auto", tiny_tokenizer, "qwen2") == ModelFormats("hermes", True)
    plain = word_tokenizer("{{ messages }}", {"a": 0})
    assert resolve_formats("auto", "auto", plain, "llama") == ModelFormats(None, False)
    assert resolve_formats("auto", "auto", plain, "chatglm") == ModelFormats("chatglm3", False)
    thinker = word_tokenizer({"default": "x", "tool_use": "<tool_call>"}, {"<think>": 1, "</think>": 2})
    assert resolve_formats("auto", "auto", thinker, "qwen3") == ModelFormats("hermes", True)
    assert resolve_formats("none", "none", tiny_tokenizer, "qwen2") == ModelFormats(None, False)
    assert resolve_formats("chatglm3", "think", plain, "llama") == ModelFormats("chatglm3", True)


def test_settings_validate_the_parser_names() -> None:
    assert EngineSettings(tool_call_parser="hermes", reasoning_parser="none").tool_call_parser == "hermes"
    with pytest.raises(SettingsError, match="tool_call_parser"):
        EngineSettings(tool_call_parser="llama3")
    with pytest.raises(SettingsError, match="reasoning_parser"):
        EngineSettings.from_parameters({"reasoning_parser": "deepseek"})


def plan(formats: ModelFormats, prompt: str = PROMPT, **raw: Any) -> tuple[Any, str]:
    return plan_output(formats, parse_parameters(raw), prompt)


def error_param(formats: ModelFormats, prompt: str = PROMPT, **raw: Any) -> str | None:
    with pytest.raises(ContractError) as caught:
        plan(formats, prompt, **raw)
    assert caught.value.info.status == 400
    return caught.value.info.param


def test_tools_need_a_tool_call_format() -> None:
    assert error_param(ModelFormats(), tools=TOOLS) == "tools"
    with pytest.raises(ContractError, match="no tool-call format"):
        plan(ModelFormats(), tools=TOOLS)
    output, suffix = plan(ModelFormats(), tools=TOOLS, tool_choice="none")  # tools unused: fine
    assert output.tool_parser is None and suffix == ""


def test_auto_tool_choice_parses_without_prefill() -> None:
    output, suffix = plan(QWEN, tools=TOOLS)
    assert (output.tool_parser, output.tool_names, output.tool_prefill, suffix) == (
        "hermes",
        frozenset({"get_weather", "get_time"}),
        "",
        "",
    )
    assert output.reasoning == REASONING_DETECT and output.report_reasoning_tokens


def test_parallel_tool_calls_false_keeps_the_first_call_only() -> None:
    two_calls = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )

    def calls(**params: Any) -> list[dict[str, Any]]:
        output, _ = plan(QWEN, tools=TOOLS, **params)
        pipeline = OutputPipeline(output)
        for piece in (two_calls[:50], two_calls[50:]):
            pipeline.feed(piece)
        pipeline.finish()
        text, _, found = pipeline.take()
        assert text.strip() == ""  # a dropped call is not shown as text either
        return found

    assert [c["function"]["name"] for c in calls()] == ["get_weather", "get_time"]
    assert [c["function"]["name"] for c in calls(parallel_tool_calls=False)] == ["get_weather"]
    with pytest.raises(ContractError, match="parallel_tool_calls"):
        parse_parameters({"parallel_tool_calls": "no"})


def test_required_and_named_tool_choice_prefill_the_call() -> None:
    output, suffix = plan(QWEN, tools=TOOLS, tool_choice="required")
    assert suffix == output.tool_prefill == "<tool_call>\n"
    assert output.reasoning == REASONING_OFF  # a forced call is the answer: nothing to think first
    named = {"type": "function", "function": {"name": "get_time"}}
    output, suffix = plan(QWEN, tools=TOOLS, tool_choice=named)
    assert suffix == output.tool_prefill == '<tool_call>\n{"name": "get_time", "arguments":'
    # When the template opened a think block, it is closed before the forced call.
    output, suffix = plan(QWEN, PROMPT + "<think>\n", tools=TOOLS, tool_choice="required")
    assert suffix == "\n</think>\n\n<tool_call>\n" and output.tool_prefill == "<tool_call>\n"


def test_chatglm3_prefills_named_calls_only() -> None:
    glm = ModelFormats(tool_parser="chatglm3")
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert plan(glm, tools=TOOLS, tool_choice=named)[1] == "get_weather\n"
    assert plan(glm, tools=TOOLS[:1], tool_choice="required")[1] == "get_weather\n"
    assert error_param(glm, tools=TOOLS, tool_choice="required") == "tool_choice"


@pytest.mark.parametrize(
    ("prompt", "kwargs", "mode"),
    [
        (PROMPT, {}, REASONING_DETECT),
        (PROMPT + "<think>\n", {}, REASONING_FORCED),  # the template opened the block
        (PROMPT + "<think>\n\n</think>\n\n", {}, REASONING_OFF),  # the template closed it
        (PROMPT, {"enable_thinking": False}, REASONING_OFF),
    ],
)
def test_reasoning_mode_follows_the_template_state(prompt: str, kwargs: dict[str, Any], mode: str) -> None:
    raw = {"chat_template_kwargs": kwargs} if kwargs else {}
    assert plan(QWEN, prompt, **raw)[0].reasoning == mode
    assert plan(ModelFormats("hermes", False), prompt, **raw)[0].reasoning == REASONING_OFF


def test_stop_strings_are_refused_while_reasoning_is_parsed() -> None:
    assert error_param(QWEN, stop=["\n"]) == "stop"
    assert error_param(QWEN, include_stop_str_in_output=True, stop_token_ids=[5]) == "include_stop_str_in_output"
    output, _ = plan(QWEN, stop=["\n"], chat_template_kwargs={"enable_thinking": False})
    assert output.reasoning == REASONING_OFF
    assert plan(QWEN, stop_token_ids=[5])[0].reasoning == REASONING_DETECT  # stop ids stay allowed
    assert plan(ModelFormats(), stop=["\n"])[0].reasoning == REASONING_OFF


def test_history_with_tool_calls_and_results_reaches_the_prompt(tiny_tokenizer: Any) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris and the time?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "12:00"},
    ]
    text = render_prompt_text(tiny_tokenizer, messages, parse_parameters({"tools": TOOLS}))
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>'
    ) in text
    assert "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>" in text
    assert '"name": "get_time"' in text.split("</tools>")[1]  # the tool list itself


def test_decode_request_appends_the_prefill_and_carries_the_plan(tiny_tokenizer: Any) -> None:
    tensors = {
        contract.MESSAGES: contract.json_tensor([{"role": "user", "content": "hi"}]),
        contract.PARAMETERS: contract.json_tensor({"tools": TOOLS, "tool_choice": "required"}),
    }
    prepared = decode_request(tensors.get, tiny_tokenizer, frozenset(), QWEN)
    assert tiny_tokenizer.decode(prepared.prompt_ids).endswith("<|im_start|>assistant\n<tool_call>\n")
    assert prepared.output.tool_prefill == "<tool_call>\n" and prepared.params.skip_special_tokens
    tensors[contract.PARAMETERS] = contract.json_tensor({"tools": TOOLS})
    glm = decode_request(tensors.get, tiny_tokenizer, frozenset(), ModelFormats("chatglm3", False))
    assert glm.params.skip_special_tokens is False  # ChatGLM3 turns are separated by special tokens
    plain = decode_request({contract.TEXT_INPUT: contract.bytes_tensor("hello")}.get, tiny_tokenizer, frozenset())
    assert plain.output.tool_parser is None and plain.output.reasoning == REASONING_OFF
