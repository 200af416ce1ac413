"""The vLLM backend's dialect: which requests speak it, its parameters, and its response formats."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from python_backend.prompt import vllm_compat
from python_backend.prompt.vllm_compat import VllmOutputs, VllmResponder
from python_backend.protocol import contract
from python_backend.protocol.contract import ChoiceDelta, TokenLogprob, TopLogprob
from python_backend.protocol.errors import ContractError
from python_backend.protocol.params import parse_parameters


def getter(tensors: dict[str, np.ndarray]) -> vllm_compat.TensorGetter:
    return tensors.get


def vllm_tensors(sampling: dict[str, Any] | None = None, **flags: bool) -> dict[str, np.ndarray]:
    tensors = {contract.TEXT_INPUT: contract.bytes_tensor("The capital of France is")}
    if sampling is not None:
        tensors[contract.SAMPLING_PARAMETERS] = contract.json_tensor(sampling)
    tensors.update({name: contract.bool_tensor(value) for name, value in flags.items()})
    return tensors


@pytest.mark.parametrize("ours", [contract.MESSAGES, contract.PARAMETERS, contract.STREAM_CHANNEL, contract.MEDIA])
def test_a_request_with_any_of_our_own_inputs_speaks_our_contract(ours: str) -> None:
    tensors = vllm_tensors({"max_tokens": 4})
    assert vllm_compat.speaks_vllm(getter(tensors))
    tensors[ours] = contract.bytes_tensor("[]")
    assert not vllm_compat.speaks_vllm(getter(tensors))


def test_our_frontends_tensors_speak_our_contract() -> None:
    # What openai_frontend/client sends for every chat and completion request.
    tensors = {
        contract.MESSAGES: contract.json_tensor([{"role": "user", "content": "hi"}]),
        contract.PARAMETERS: contract.json_tensor({"max_tokens": 4}),
        contract.STREAM: contract.bool_tensor(True),
    }
    assert not vllm_compat.speaks_vllm(getter(tensors))


def test_numbers_sent_as_strings_are_cast_by_the_fields_type() -> None:
    # The vllm_backend sample client's and CI test's parameters.
    raw = {"temperature": "0.1", "top_p": "0.95", "max_tokens": "100", "seed": "7", "ignore_eos": "false"}
    params = parse_parameters(vllm_compat.to_generation_parameters(raw))
    assert (params.temperature, params.top_p, params.max_tokens, params.seed) == (0.1, 0.95, 100, 7)
    assert params.ignore_eos is False  # not Python's bool("false")


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ({"temperature": "warm"}, "temperature"),
        ({"max_tokens": "1.5"}, "max_tokens"),
        ({"ignore_eos": "maybe"}, "ignore_eos"),
        ({"no_such_field": 1}, "no_such_field"),
        ({"min_p": 0.2}, "min_p"),
        ({"logprobs": -1}, "logprobs"),
    ],
)
def test_bad_sampling_parameters_name_the_field(raw: dict[str, Any], param: str) -> None:
    with pytest.raises(ContractError) as caught:
        parse_parameters(vllm_compat.to_generation_parameters(raw))
    assert caught.value.info.param == param


def test_vllm_meanings_logprobs_top_n_lora_name_and_the_default_length() -> None:
    params = parse_parameters(vllm_compat.to_generation_parameters({"logprobs": "2", "lora_name": "tiny-lora"}))
    assert (params.logprobs, params.top_logprobs, params.lora) == (True, 2, "tiny-lora")
    assert params.max_tokens == vllm_compat.VLLM_DEFAULT_MAX_TOKENS
    only_sampled = parse_parameters(vllm_compat.to_generation_parameters({"logprobs": 0}))
    assert (only_sampled.logprobs, only_sampled.top_logprobs) == (True, 0)
    # The "off" values of fields this model does not implement are accepted.
    defaults = {"min_p": 0.0, "detokenize": True, "spaces_between_special_tokens": True, "logit_bias": None}
    assert parse_parameters(vllm_compat.to_generation_parameters(defaults)).logprobs is False


def test_nvidia_frontends_structured_outputs_becomes_a_json_schema() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    raw = {"structured_outputs": json.dumps({"json": json.dumps(schema)}), "max_tokens": 8}
    params = parse_parameters(vllm_compat.to_generation_parameters(raw))
    assert params.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "structured_outputs", "schema": schema},
    }


def test_parameters_come_from_the_tensor_else_from_the_request_parameters() -> None:
    as_params = json.dumps({"temperature": "0", "max_tokens": 5, "triton_enable_empty_final_response": True})
    read = vllm_compat.read_vllm_request(getter(vllm_tensors()), as_params, stream=True)
    assert read.parameters == {"temperature": 0.0, "max_tokens": 5}
    both = vllm_compat.read_vllm_request(getter(vllm_tensors({"max_tokens": 3})), as_params, stream=True)
    assert both.parameters == {"max_tokens": 3}  # the tensor wins, as in the vLLM backend


def test_the_prompt_is_echoed_unless_streaming_or_excluded() -> None:
    assert vllm_compat.read_vllm_request(getter(vllm_tensors()), "", stream=False).echo_prompt
    assert not vllm_compat.read_vllm_request(getter(vllm_tensors()), "", stream=True).echo_prompt
    excluded = vllm_tensors(exclude_input_in_output=True)
    assert not vllm_compat.read_vllm_request(getter(excluded), "", stream=False).echo_prompt
    with pytest.raises(ContractError) as caught:
        vllm_compat.read_vllm_request(getter(vllm_tensors(exclude_input_in_output=False)), "", stream=True)
    assert caught.value.info.param == contract.EXCLUDE_INPUT_IN_OUTPUT


def test_the_cumulative_logprob_turns_on_logprob_computation_but_not_their_output() -> None:
    read = vllm_compat.read_vllm_request(getter(vllm_tensors(return_cumulative_logprob=True)), "", stream=False)
    assert (read.parameters["logprobs"], read.parameters["top_logprobs"]) == (True, 0)
    assert read.outputs == VllmOutputs(cumulative_logprob=True, logprobs_asked=False)


def test_a_response_carries_only_the_outputs_asked_for() -> None:
    delta = ChoiceDelta(index=0, text="Paris", num_input_tokens=5, num_output_tokens=1)
    assert set(VllmResponder(VllmOutputs()).encode(delta)) == {contract.TEXT_OUTPUT}
    finished = ChoiceDelta(index=0, text=".", finish_reason="stop", num_input_tokens=5, num_output_tokens=2)
    assert set(VllmResponder(VllmOutputs()).encode(finished)) == {contract.TEXT_OUTPUT}


def test_finish_reason_reads_none_until_the_end_and_token_counts_are_per_response() -> None:
    responder = VllmResponder(VllmOutputs(finish_reason=True, num_input_tokens=True, num_output_tokens=True))
    deltas = [
        ChoiceDelta(index=0, text="a", num_input_tokens=5, num_output_tokens=1),
        ChoiceDelta(index=0, text="bc", num_input_tokens=5, num_output_tokens=3),
        ChoiceDelta(index=0, text="", finish_reason="length", num_input_tokens=5, num_output_tokens=4),
    ]
    encoded = [responder.encode(d) for d in deltas]
    assert [contract.read_string(e[contract.FINISH_REASON]) for e in encoded] == ["None", "None", "length"]
    assert [int(e[contract.NUM_OUTPUT_TOKENS][0]) for e in encoded] == [1, 2, 1]  # sums to 4
    assert all(int(e[contract.NUM_INPUT_TOKENS][0]) == 5 for e in encoded)
    assert all(e[contract.NUM_OUTPUT_TOKENS].dtype == np.uint32 for e in encoded)


def test_each_choice_counts_its_own_tokens() -> None:
    responder = VllmResponder(VllmOutputs(num_output_tokens=True))
    first = responder.encode(ChoiceDelta(index=0, text="a", num_output_tokens=3))
    second = responder.encode(ChoiceDelta(index=1, text="b", num_output_tokens=2))
    assert (int(first[contract.NUM_OUTPUT_TOKENS][0]), int(second[contract.NUM_OUTPUT_TOKENS][0])) == (3, 2)
    assert int(second[contract.CHOICE_INDEX][0]) == 1


def test_logprobs_are_keyed_by_token_id_with_rank_and_decoded_token() -> None:
    token = TokenLogprob(" Paris", -0.25, [], [TopLogprob(" Paris", -0.25, [], 3681), TopLogprob(" Lyon", -2.0, [], 9)])
    token.token_id, token.rank = 3681, 1
    delta = ChoiceDelta(index=0, text=" Paris", logprobs=[token], num_output_tokens=1, cumulative_logprob=-0.25)
    asked = VllmOutputs(logprobs=True, cumulative_logprob=True, logprobs_asked=True)
    encoded = VllmResponder(asked).encode(delta)
    assert json.loads(contract.read_string(encoded[contract.LOGPROBS]) or "") == [
        {
            "3681": {"logprob": -0.25, "rank": 1, "decoded_token": " Paris"},
            "9": {"logprob": -2.0, "rank": 2, "decoded_token": " Lyon"},
        }
    ]
    assert encoded[contract.CUMULATIVE_LOGPROB].dtype == np.float32
    assert float(encoded[contract.CUMULATIVE_LOGPROB][0]) == -0.25


def test_logprobs_read_null_when_the_parameters_did_not_ask_for_them() -> None:
    encoded = VllmResponder(VllmOutputs(logprobs=True)).encode(ChoiceDelta(index=0, text="x", logprobs=[]))
    assert contract.read_string(encoded[contract.LOGPROBS]) == "null"


def test_our_logprobs_json_keeps_only_the_openai_fields() -> None:
    token = TokenLogprob("a", -1.0, [97], [TopLogprob("a", -1.0, [97], 64)], token_id=64, rank=1)
    wire = json.loads(
        contract.read_string(contract.encode_delta(ChoiceDelta(index=0, logprobs=[token]))[contract.LOGPROBS]) or ""
    )
    assert wire == [
        {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": [{"token": "a", "logprob": -1.0, "bytes": [97]}]}
    ]
