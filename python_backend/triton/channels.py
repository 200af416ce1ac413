"""Response channels on the model's side: which are open, and one response per channel per pass.

Owns ``ChannelRegistry`` (channels opened by ``open_channel`` requests, found by the requests that
name them in ``stream_channel``, closed when their caller cancels, a send on them fails, or the
model stops), ``Outgoing`` (one engine event on its way to a transport) and ``plan_delivery``,
which turns the events of one engine pass into one response per channel plus the sends that
must go on the requests' own streams, in an order that keeps each request's events in order.

Why channels: under the Python backend every response is a blocking round trip from the stub to
tritonserver and on through gRPC (docs/performance.md); at 16 streams that is 16
round trips per decode step, on the two cores the engine computes on. A channel carries every
delta of a pass for the requests that name it in one response, as vLLM's engine sends one message
per step; each request's own stream then carries only its end (the final flag) or its error.
Nothing here imports Triton: ``sender.py`` does the sending.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from python_backend.engine.sequence import EngineEvent
from python_backend.prompt.vllm_compat import VllmResponder
from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry
from python_backend.protocol.errors import ContractError, channel_closed, invalid

CHANNEL_NAME = re.compile(r"[A-Za-z0-9_.:-]{8,128}")
# How often an open channel is asked whether its caller cancelled it (a round trip each): a
# channel's caller that goes away (a frontend that stops) is noticed within this long.
CANCEL_CHECK_S = 1.0


@dataclass(eq=False)
class Channel:
    """One open channel; ``closed`` is set once, from any thread, and read by cancel watchers."""

    name: str
    link: Any  # the channel's own ResponseLink: send(response, flags), is_cancelled()
    closed: bool = False
    checked_at: float = field(default_factory=time.monotonic)


@dataclass
class Outgoing:
    """One engine event for one request, with where it goes."""

    sender: Any  # the request's own ResponseLink
    event: EngineEvent
    echo_prompt: str = ""
    counts: contract.CountOutputs = contract.CountOutputs()
    channel: Channel | None = None  # the channel its deltas go to, if it named one
    vllm: VllmResponder | None = None  # set: a vLLM-contract request, answered in its formats


@dataclass
class Delivery:
    """What to send for a burst of events: each channel's entries first, then the direct sends."""

    batches: list[tuple[Channel, list[ChannelEntry]]]
    direct: list[Outgoing]


class ChannelRegistry:
    """The open channels by name; safe to use from the stub's thread and the sender thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, Channel] = {}

    def open(self, name: str, link: Any) -> Channel:
        if not CHANNEL_NAME.fullmatch(name):
            raise invalid("open_channel must be 8-128 characters of letters, digits and _.:-", contract.OPEN_CHANNEL)
        with self._lock:
            if name in self._open:
                raise invalid(f"a channel named '{name}' is already open", contract.OPEN_CHANNEL)
            channel = Channel(name, link)
            self._open[name] = channel
            return channel

    def get(self, name: str) -> Channel | None:
        with self._lock:
            return self._open.get(name)

    def find(self, name: str) -> Channel:
        channel = self.get(name)
        if channel is None:
            # Usually a race with a restart or the caller's own close: the caller may open again.
            raise ContractError(channel_closed(name, contract.STREAM_CHANNEL))
        return channel

    def close(self, channel: Channel) -> bool:
        """Mark it closed; True if it was open (the caller then sends its final flag)."""
        channel.closed = True
        with self._lock:
            return self._open.pop(channel.name, None) is channel

    def due_for_check(self, now: float) -> list[Channel]:
        """Open channels not asked about cancellation for ``CANCEL_CHECK_S``; marks them asked."""
        with self._lock:
            due = [c for c in self._open.values() if now - c.checked_at >= CANCEL_CHECK_S]
        for channel in due:
            channel.checked_at = now
        return due

    def close_all(self) -> list[Channel]:
        with self._lock:
            channels, self._open = list(self._open.values()), {}
        for channel in channels:
            channel.closed = True
        return channels


def plan_delivery(items: list[Outgoing]) -> Delivery:
    """Group a burst of events: channel-bound deltas become entries of their channel's response;
    a channel-bound request's end also goes on its own stream (after the channel's response, so a
    caller that sees the stream end has the last entry in flight before it); errors and requests
    without a channel go directly, in order."""
    batches: dict[str, tuple[Channel, list[ChannelEntry]]] = {}
    direct: list[Outgoing] = []
    for item in items:
        channel, event = item.channel, item.event
        if channel is None or event.error is not None:
            direct.append(item)
            continue
        if not channel.closed:
            delta = event.delta
            if delta is not None and item.echo_prompt:
                delta.text = item.echo_prompt + delta.text
            batch = batches.setdefault(channel.name, (channel, []))
            batch[1].append(ChannelEntry(event.request_id, delta, last=event.final))
        # A closed channel drops the deltas: the request is cancelled by its watcher.
        if event.final:
            direct.append(replace(item, event=EngineEvent(event.request_id, final=True), channel=None))
    return Delivery(list(batches.values()), direct)
