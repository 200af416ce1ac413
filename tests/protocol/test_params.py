"""Generation-parameter validation: ranges, types, defaults and cross-field rules."""

from __future__ import annotations

import math

import pytest

from python_backend.protocol.errors import ContractError
from python_backend.protocol.params import check_vocabulary, parse_parameters


def error_of(raw: dict, stream: bool = False):
    with pytest.raises(ContractError) as caught:
        parse_parameters(raw, stream=stream)
    return caught.value.info


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1e-6}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2**31}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 2.01}, "repetition_penalty"),
        ({"presence_penalty": -2.01}, "presence_penalty"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"stop": ""}, "stop.0"),
        ({"stop": ["a", ""]}, "stop.1"),
        ({"stop": "x" * 32769}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": [1, None]}, "stop_token_ids.1"),
        ({"stop_token_ids": "1"}, "stop_token_ids"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"best_of": 129}, "best_of"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
        ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking"),
        ({"unknown_knob": 1}, "unknown_knob"),
        ({"n": 2, "temperature": 0}, "temperature"),
        ({"n": 2, "best_of": 1}, "best_of"),
        ({"use_beam_search": True, "stop": "x"}, "stop"),
        ({"use_beam_search": True, "stop_token_ids": [3]}, "stop_token_ids"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "stop": "x"}, "stop"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "logprobs": True}, "logprobs"),
        ({"tools": [{"type": "code", "function": {"name": "f"}}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools.0.function.name"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        (
            {
                "tool_choice": {"type": "function", "function": {"name": "g"}},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "tool_choice",
        ),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"logit_bias": [[5, 1]]}, "logit_bias"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"-3": 1}}, "logit_bias"),
        ({"logit_bias": {"1.5": 1}}, "logit_bias"),
        ({"logit_bias": {"7": 100.5}}, "logit_bias"),
        ({"logit_bias": {"7": -101}}, "logit_bias"),
        ({"logit_bias": {"7": "high"}}, "logit_bias"),
        ({"logit_bias": {"7": True}}, "logit_bias"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"add_generation_prompt": "no"}, "add_generation_prompt"),
        ({"continue_final_message": 1}, "continue_final_message"),
        ({"continue_final_message": True}, "continue_final_message"),
        ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
        ({"use_beam_search": True, "logit_bias": {"3": 1}}, "logit_bias"),
        ({"use_beam_search": True, "min_p": 0.1}, "min_p"),
    ],
)
def test_bad_values_are_400_naming_the_field(raw: dict, param: str) -> None:
    info = error_of(raw)
    assert info.status == 400
    assert info.param == param
    assert info.type == "invalid_request_error"
    assert param.split(".")[0] in info.message


def test_streaming_rules_for_best_of() -> None:
    assert error_of({"best_of": 2, "temperature": 1}, stream=True).param == "best_of"
    assert error_of({"best_of": 3, "n": 2, "temperature": 1}, stream=True).param == "best_of"
    assert parse_parameters({"best_of": 2, "n": 2, "temperature": 1}, stream=True).candidates == 2
    assert parse_parameters({"best_of": 3, "n": 2, "temperature": 1}).candidates == 3


def test_defaults_and_normalisation() -> None:
    p = parse_parameters({})
    assert p.temperature is None and p.top_p is None and p.top_k is None  # model defaults apply
    assert p.n == 1 and p.max_tokens is None and p.skip_special_tokens is True
    assert parse_parameters({"top_k": -1}).top_k == 0
    assert parse_parameters({"top_k": 0}).top_k == 0
    assert parse_parameters({"stop": []}).stop == ()
    assert parse_parameters({"stop": "end"}).stop == ("end",)
    assert parse_parameters({"seed": 2**64 - 1}).seed == 2**64 - 1
    assert parse_parameters({"max_completion_tokens": 7}).max_tokens == 7


def test_top_logprobs_turns_logprobs_on() -> None:
    p = parse_parameters({"top_logprobs": 2})
    assert p.logprobs is True and p.top_logprobs == 2
    assert parse_parameters({"top_logprobs": 2, "logprobs": False}).logprobs is False


@pytest.mark.parametrize("bad", [-1, 2**31, 2**64])
def test_stop_token_ids_outside_int32_are_a_400_naming_the_element(bad: int) -> None:
    assert parse_parameters({"stop_token_ids": [2, 2**31 - 1, 0]}).stop_token_ids == (2, 2**31 - 1, 0)
    with pytest.raises(ContractError) as caught:
        parse_parameters({"stop_token_ids": [2, bad, 13]})
    assert caught.value.info.status == 400 and caught.value.info.param == "stop_token_ids.1"


def test_nulls_mean_not_given() -> None:
    p = parse_parameters({k: None for k in ("temperature", "top_p", "seed", "stop", "n", "best_of", "max_tokens")})
    assert p.n == 1 and p.stop == () and p.seed is None


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("raw", "stream"),
    [
        ({}, False),
        ({"temperature": 0, "top_p": 0.5, "top_k": -1, "seed": 2**64 - 1, "max_completion_tokens": 7}, False),
        ({"top_logprobs": 3}, False),
        ({"top_logprobs": 0}, True),
        ({"logprobs": False, "top_logprobs": 5}, False),
        ({"best_of": 1}, False),
        ({"best_of": 3, "n": 3, "temperature": 0.7}, True),
        ({"best_of": 2}, False),
        ({"n": 1, "best_of": 1}, True),
        ({"stop": "END", "stop_token_ids": [5, 2**31 - 1], "include_stop_str_in_output": True}, False),
        ({"repetition_penalty": 1.0, "presence_penalty": 0, "min_tokens": 0, "skip_special_tokens": False}, True),
        ({"use_beam_search": True, "best_of": 4}, False),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, True),
        ({"tools": [TOOL], "parallel_tool_calls": False, "chat_template_kwargs": {"enable_thinking": False}}, False),
        ({"response_format": {"type": "text"}, "ignore_eos": True, "lora": "adapter"}, False),
        ({"response_format": {"type": "json_object"}}, True),
        ({"logit_bias": {"12": 100, "3": -100, "7": 0.5}, "min_p": 0.05}, False),
        ({"add_generation_prompt": False, "continue_final_message": True}, True),
        ({"add_generation_prompt": False}, False),
    ],
)
def test_the_canonical_form_parses_back_to_the_same_parameters(raw: dict, stream: bool) -> None:
    params = parse_parameters(raw, stream=stream)
    wire = params.to_wire()
    assert parse_parameters(wire, stream=stream) == params
    assert parse_parameters(wire, stream=stream).to_wire() == wire


def test_the_canonical_form_names_only_what_differs_from_the_defaults() -> None:
    assert parse_parameters({"temperature": 1, "top_k": -1, "max_completion_tokens": 5, "n": 1}).to_wire() == {
        "temperature": 1.0,
        "top_k": 0,
        "max_tokens": 5,
    }
    assert parse_parameters({"stop": "x", "response_format": {"type": "text"}}).to_wire() == {"stop": ["x"]}


def test_logit_bias_is_read_as_token_ids_with_numeric_biases() -> None:
    p = parse_parameters({"logit_bias": {"12": 100, "3": -100, "07": 0.5}})
    assert p.logit_bias == ((3, -100.0), (7, 0.5), (12, 100.0))
    assert p.to_wire()["logit_bias"] == {"3": -100.0, "7": 0.5, "12": 100.0}
    assert parse_parameters({"logit_bias": {}}).logit_bias == ()


def test_logit_bias_token_ids_must_be_in_the_vocabulary() -> None:
    params = parse_parameters({"logit_bias": {"99": 1, "100": 1}})
    check_vocabulary(parse_parameters({"logit_bias": {"99": 1}}), 100)  # the last id is fine
    with pytest.raises(ContractError) as caught:
        check_vocabulary(params, 100)
    assert caught.value.info.status == 400 and caught.value.info.param == "logit_bias"
    assert "100" in caught.value.info.message


def test_template_switches_default_to_a_new_assistant_turn() -> None:
    p = parse_parameters({})
    assert p.add_generation_prompt is True and p.continue_final_message is False and p.min_p == 0.0
