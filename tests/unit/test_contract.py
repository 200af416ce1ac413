"""The tensor contract: deltas and errors survive encoding both ways."""

from __future__ import annotations

from python_backend import contract
from python_backend.contract import ChoiceDelta, ChoiceUsage, ErrorInfo, TokenLogprob, TopLogprob


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
    )
    tensors = contract.encode_delta(delta)
    assert set(tensors) == set(contract.OUTPUT_NAMES)
    sparse = contract.encode_delta(ChoiceDelta(index=1, text="x"))
    assert set(sparse) == {contract.TEXT_OUTPUT, contract.CHOICE_INDEX, contract.NUM_INPUT_TOKENS, contract.NUM_OUTPUT_TOKENS}
    assert contract.decode_delta(tensors) == delta


def test_empty_fields_decode_as_absent() -> None:
    decoded = contract.decode_delta(contract.encode_delta(ChoiceDelta(index=0, text="x")))
    assert decoded.finish_reason is None and decoded.usage is None and decoded.logprobs is None
    assert decoded.tool_calls == []
    assert contract.decode_delta({}).text == ""


def test_error_round_trip_and_foreign_errors() -> None:
    info = ErrorInfo(429, "busy", "rate_limit_exceeded", None, "overloaded")
    assert ErrorInfo.from_wire(info.to_wire()) == info
    # Triton prefixes or wraps messages; the JSON is still found.
    assert ErrorInfo.from_wire("in ensemble: " + info.to_wire()) == info
    foreign = ErrorInfo.from_wire("Stub process 'triton_chat_0_0' is not healthy.")
    assert foreign.status == 503 and "Stub" not in foreign.message


def test_input_helpers() -> None:
    assert contract.read_string(contract.bytes_tensor("é")) == "é"
    assert contract.read_json(contract.json_tensor({"a": [1]}), "x") == {"a": [1]}
    assert contract.read_bool(contract.bool_tensor(True)) is True
    assert contract.read_bool(None, default=True) is True
    assert contract.read_string(None) is None
