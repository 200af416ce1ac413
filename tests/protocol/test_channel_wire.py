"""The channel's wire form: every field of a delta, and a request's end, read back as sent."""

from __future__ import annotations

import pytest

from python_backend.protocol.channel_wire import ChannelEntry, decode_entries, encode_entries
from python_backend.protocol.contract import ChoiceDelta, ChoiceUsage, TokenLogprob, TopLogprob


def test_entries_round_trip_with_every_field() -> None:
    full = ChoiceDelta(
        2,
        text="Grüß 你好 \x00\n",
        reasoning="hm",
        tool_calls=[{"index": 0, "function": {"name": "f", "arguments": "{}"}}],
        finish_reason="tool_calls",
        logprobs=[TokenLogprob("x", -0.5, [120], [TopLogprob("x", -0.5, [120])])],
        usage=ChoiceUsage(3, 1, cached_tokens=2, batch_size=[4], queue_wait_time=[7], prefill_time=1.5),
        num_input_tokens=3,
        num_output_tokens=1,
    )
    entries = [
        ChannelEntry("chatcmpl-1", ChoiceDelta(0, text="")),
        ChannelEntry("chatcmpl-2", full, last=True),
        ChannelEntry("chatcmpl-3", None, last=True),
        ChannelEntry("chatcmpl-4", ChoiceDelta(0, text="a", logprobs=[])),
    ]
    assert decode_entries(encode_entries(entries)) == entries


@pytest.mark.parametrize("text", ['{"id": "x"}', '[{"delta": {}}]', "[1]", "not json"])
def test_anything_else_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        decode_entries(text)
