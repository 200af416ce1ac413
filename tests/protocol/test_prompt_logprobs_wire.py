"""The ``prompt_logprobs`` parameter and output: its range and rules, and its wire forms."""

from __future__ import annotations

import math

import pytest

from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry, decode_entries, encode_entries
from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.errors import ContractError
from python_backend.protocol.params import parse_parameters
from python_backend.protocol.prompt_logprobs import PromptCandidate, PromptPosition

SCORED = [
    PromptPosition(11, "<s>"),
    PromptPosition(42, " héllo", -1.5, 3, (PromptCandidate(7, -0.25, 1, " a"), PromptCandidate(9, -1.0, 2, "你"))),
    PromptPosition(5, "!", -math.inf, 9000, (PromptCandidate(7, -0.5, 1, " a"),)),
]


def test_prompt_logprobs_range_and_wire_form() -> None:
    assert parse_parameters({}).prompt_logprobs is None
    assert parse_parameters({"prompt_logprobs": 0}).prompt_logprobs == 0
    params = parse_parameters({"prompt_logprobs": 20})
    assert params.prompt_logprobs == 20 and parse_parameters(params.to_wire()) == params
    for bad in (-1, 21, 1.5, True, "2"):
        with pytest.raises(ContractError) as caught:
            parse_parameters({"prompt_logprobs": bad})
        assert caught.value.info.param == "prompt_logprobs"


def test_prompt_logprobs_are_refused_with_beam_search() -> None:
    with pytest.raises(ContractError) as caught:
        parse_parameters({"prompt_logprobs": 1, "use_beam_search": True, "n": 2})
    assert caught.value.info.param == "prompt_logprobs"


def test_the_output_tensor_carries_every_position_and_only_when_given() -> None:
    delta = ChoiceDelta(index=0, text="x", prompt_logprobs=SCORED)
    tensors = contract.encode_delta(delta)
    assert set(tensors) == {contract.TEXT_OUTPUT, contract.PROMPT_LOGPROBS}
    assert contract.decode_delta(tensors).prompt_logprobs == SCORED
    assert contract.decode_delta(contract.encode_delta(ChoiceDelta(index=0, text="x"))).prompt_logprobs is None


def test_a_malformed_tensor_is_a_400_naming_it() -> None:
    with pytest.raises(ContractError) as caught:
        contract.decode_delta({contract.PROMPT_LOGPROBS: contract.bytes_tensor('[{"token": "a"}]')})
    assert caught.value.info.param == "prompt_logprobs"


def test_a_channel_entry_carries_them_too() -> None:
    entries = [ChannelEntry("cmpl-1", ChoiceDelta(0, text="a", prompt_logprobs=SCORED))]
    assert decode_entries(encode_entries(entries)) == entries
