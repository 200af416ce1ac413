"""The model's side of response channels: the registry, and one response per channel per pass."""

from __future__ import annotations

import pytest

from python_backend.engine.sequence import EngineEvent
from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry
from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.errors import ContractError, ErrorInfo
from python_backend.triton.channels import CANCEL_CHECK_S, ChannelRegistry, Outgoing, plan_delivery


def test_registry_opens_finds_and_closes_once() -> None:
    registry = ChannelRegistry()
    channel = registry.open("frontend-0123456789", link="link")
    assert registry.find("frontend-0123456789") is channel
    with pytest.raises(ContractError) as twice:
        registry.open("frontend-0123456789", link="other")
    assert twice.value.info.param == contract.OPEN_CHANNEL and twice.value.info.status == 400
    assert registry.close(channel) and channel.closed
    assert not registry.close(channel)  # the final flag goes out once
    with pytest.raises(ContractError) as gone:
        registry.find("frontend-0123456789")
    assert (gone.value.info.status, gone.value.info.code, gone.value.info.param) == (
        503,
        "channel_closed",
        contract.STREAM_CHANNEL,
    )


@pytest.mark.parametrize("name", ["short", "x" * 129, "has space in it", "semi;colon-123"])
def test_bad_channel_names_are_refused_naming_the_input(name: str) -> None:
    with pytest.raises(ContractError) as caught:
        ChannelRegistry().open(name, link=None)
    assert caught.value.info.param == contract.OPEN_CHANNEL


def test_channels_are_asked_about_cancellation_at_most_once_a_period() -> None:
    registry = ChannelRegistry()
    channel = registry.open("frontend-aaaaaaaa", link=None)
    start = channel.checked_at
    assert registry.due_for_check(start + CANCEL_CHECK_S / 2) == []
    assert registry.due_for_check(start + CANCEL_CHECK_S) == [channel]
    assert registry.due_for_check(start + CANCEL_CHECK_S * 1.5) == []
    assert registry.close_all() == [channel] and channel.closed
    assert registry.due_for_check(start + 10 * CANCEL_CHECK_S) == []


def _event(request_id: str, text: str | None, final: bool = False, error: ErrorInfo | None = None) -> EngineEvent:
    delta = ChoiceDelta(0, text=text) if text is not None else None
    return EngineEvent(request_id, delta=delta, error=error, final=final)


def test_a_pass_becomes_one_response_per_channel_then_the_ends_on_their_own_streams() -> None:
    registry = ChannelRegistry()
    a, b = registry.open("channel-aaaa", link="a"), registry.open("channel-bbbb", link="b")
    error = ErrorInfo(500, "boom", "internal_error")
    items = [
        Outgoing("s1", _event("r1", "x"), channel=a),
        Outgoing("s2", _event("r2", "y", final=True), channel=a),
        Outgoing("s3", _event("r3", "z"), channel=b),
        Outgoing("s4", _event("r4", "plain")),  # a request without a channel
        Outgoing("s5", _event("r5", None, final=True, error=error), channel=a),
        Outgoing("s6", _event("r6", None, final=True), channel=b),  # cancelled: no text, just the end
    ]
    delivery = plan_delivery(items)
    assert [(c.name, entries) for c, entries in delivery.batches] == [
        (
            "channel-aaaa",
            [ChannelEntry("r1", ChoiceDelta(0, text="x")), ChannelEntry("r2", ChoiceDelta(0, text="y"), True)],
        ),
        ("channel-bbbb", [ChannelEntry("r3", ChoiceDelta(0, text="z")), ChannelEntry("r6", None, True)]),
    ]
    # Direct sends: the plain request's delta, r2's end (flags only, after its last entry), the
    # error on r5's own stream, r6's end; in arrival order.
    assert [(o.sender, o.event) for o in delivery.direct] == [
        ("s2", EngineEvent("r2", final=True)),
        ("s4", items[3].event),
        ("s5", items[4].event),
        ("s6", EngineEvent("r6", final=True)),
    ]
    assert delivery.direct[0].channel is None and delivery.direct[3].channel is None  # own streams


def test_a_closed_channel_drops_deltas_but_its_requests_still_end() -> None:
    registry = ChannelRegistry()
    channel = registry.open("channel-cccc", link="c")
    registry.close(channel)
    delivery = plan_delivery(
        [
            Outgoing("s1", _event("r1", "x"), channel=channel),
            Outgoing("s1", _event("r1", "y", final=True), channel=channel),
        ]
    )
    assert delivery.batches == []
    assert [(o.sender, o.event) for o in delivery.direct] == [("s1", EngineEvent("r1", final=True))]


def test_echoed_prompts_are_prefixed_as_on_per_request_streams() -> None:
    channel = ChannelRegistry().open("channel-dddd", link="d")
    delivery = plan_delivery([Outgoing("s", _event("r", "answer", final=True), echo_prompt="prompt ", channel=channel)])
    assert delivery.batches[0][1][0].delta == ChoiceDelta(0, text="prompt answer")
