"""The tensor contract: deltas and errors survive encoding both ways."""

from __future__ import annotations

from python_backend.protocol import contract
from python_backend.protocol.contract import ChoiceDelta, ChoiceUsage, TokenLogprob, TopLogprob
from python_backend.protocol.prompt_logprobs import PromptPosition


def test_delta_round_trip() -> None:
    delta = ChoiceDelta(
        index=2,
        text="héllo 你好",
        reasoning="thinking",
        tool_calls=[{"index": 0, "function": {"arguments": "{}"}}],
        finish_reason="length",
        logprobs=[TokenLogprob("h", -0.5, [104], [TopLogprob("h", -0.5, [104])])],
        usage=ChoiceUsage(3, 2, batch_size=[1, 2], queue_wait_time=[10, 20], prefill_time=1.5, decode_time_arr=[2.0]),
        num_input_tokens=3,
        num_output_tokens=2,
        prompt_logprobs=[PromptPosition(1, "a"), PromptPosition(2, "b", -0.5, 1)],
    )
    tensors = contract.encode_delta(delta)
    assert set(tensors) == set(contract.DELTA_OUTPUT_NAMES)
    assert contract.decode_delta(tensors) == delta


def test_a_streamed_token_carries_only_its_text() -> None:
    # One tensor per streamed token: each costs IPC, a Triton output buffer and a gRPC field.
    running = ChoiceDelta(index=0, text="x", num_input_tokens=7, num_output_tokens=3)
    assert set(contract.encode_delta(running)) == {contract.TEXT_OUTPUT}
    decoded = contract.decode_delta(contract.encode_delta(running))
    assert (decoded.index, decoded.text, decoded.num_output_tokens) == (0, "x", 0)
    second_choice = contract.encode_delta(ChoiceDelta(index=1, text="y"))
    assert set(second_choice) == {contract.TEXT_OUTPUT, contract.CHOICE_INDEX}
    assert contract.decode_delta(second_choice).index == 1


def test_token_counts_on_the_last_response_or_every_one_when_asked() -> None:
    last = ChoiceDelta(index=0, text="", finish_reason="stop", num_input_tokens=7, num_output_tokens=3)
    decoded = contract.decode_delta(contract.encode_delta(last))
    assert (decoded.num_input_tokens, decoded.num_output_tokens) == (7, 3)
    running = ChoiceDelta(index=0, text="x", num_input_tokens=7, num_output_tokens=2)
    only_output = contract.encode_delta(running, contract.CountOutputs(output_tokens=True))
    assert set(only_output) == {contract.TEXT_OUTPUT, contract.NUM_OUTPUT_TOKENS}
    both = contract.decode_delta(contract.encode_delta(running, contract.CountOutputs(True, True)))
    assert (both.num_input_tokens, both.num_output_tokens) == (7, 2)


def test_empty_fields_decode_as_absent() -> None:
    decoded = contract.decode_delta(contract.encode_delta(ChoiceDelta(index=0, text="x")))
    assert decoded.finish_reason is None and decoded.usage is None and decoded.logprobs is None
    assert decoded.tool_calls == []
    assert contract.decode_delta({}).text == ""


def test_input_helpers() -> None:
    assert contract.read_string(contract.bytes_tensor("é")) == "é"
    assert contract.read_json(contract.json_tensor({"a": [1]}), "x") == {"a": [1]}
    assert contract.read_bool(contract.bool_tensor(True)) is True
    assert contract.read_bool(None, default=True) is True
    assert contract.read_string(None) is None
