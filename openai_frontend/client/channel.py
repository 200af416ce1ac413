"""The frontend's end of a response channel: one gRPC stream for every streamed delta.

Owns ``ResponseChannel``: it opens (lazily, once for any number of concurrent callers) a
``ModelStreamInfer`` call whose request carries ``open_channel``, waits for the model's first
response (the channel is open), then reads one response per engine pass and hands each entry to
the queue of the request it names (``subscribe``). When the call ends or fails, each request
still waiting on it gets ``ChannelLost`` and the next request opens a new channel. A model that
refuses to open one (an older model, a foreign Triton) is asked again only after ``RETRY_S``;
until then callers get ``None`` and use per-request streams, as before channels existed.

Channels are rotated: tritonserver (2.51; server PR #7879) keeps every response of a request
until the request ends, so a channel that lived for ever would grow tritonserver without bound
(measured: +46 MB in two minutes of load). After ``ROTATE_AFTER`` responses the next channel is
opened in the background; once it is open, new requests go to it and the old one is closed as
soon as its last request ended. So a channel holds about as many responses as the per-request streams it replaces.

Why: see ``python_backend/triton/channels.py``. Per streamed token this saves the stub's
blocking send, tritonserver's response and a gRPC message here; per engine pass there is one.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from tritonclient.utils import InferenceServerException

from openai_frontend.aio import within
from openai_frontend.client.reads import GuardedReads
from openai_frontend.client.results import contract_input, outputs_by_name
from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry, decode_entries

logger = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 5.0  # the model answers an open at once; longer means it is busy loading or hung
RETRY_S = 30.0  # after the model refused to open one, per-request streams for this long
CLOSE_WAIT_S = 2.0  # for the model to end the channel when this frontend stops
ROTATE_AFTER = 200  # responses a channel carries before new requests go to a fresh one
UNREACHABLE_RETRY_S = 1.0  # after an open that failed on the way (tritonserver down, restarting)


@dataclass(frozen=True)
class ChannelLost:
    """The channel a request was waiting on ended; its deltas will not come."""

    reason: str


async def control_request(client: Any, model_name: str, input_name: str, value: str, timeout_s: float) -> None:
    """One of the contract's control requests (``cancel_request``), read to its final response;
    raises the model's error, if any."""

    async def request() -> AsyncIterator[dict[str, Any]]:
        inputs = [contract_input(input_name, contract.bytes_tensor(value))]
        yield {"model_name": model_name, "inputs": inputs, "request_id": f"{input_name}-{uuid.uuid4().hex}"}

    async for _result, error in client.stream_infer(request(), stream_timeout=timeout_s):
        if error is not None:
            raise error


@dataclass(eq=False)
class _Open:
    """One open channel: its call, the task reading it, and the requests waiting on it."""

    name: str
    reads: GuardedReads
    waiting: set[str] = field(default_factory=set)  # request ids subscribed to this channel
    responses: int = 0
    retired: bool = False  # takes no new requests; closed once ``waiting`` is empty
    reader: asyncio.Task[None] | None = None


class ResponseChannel:
    """This frontend's channels to one model; see the module doc."""

    def __init__(self, client: Any, model_name: str, heard: Callable[[], None] | None = None) -> None:
        self._client = client  # tritonclient.grpc.aio.InferenceServerClient (or a stand-in)
        self._model_name = model_name
        self._heard = heard  # told of each entry read (``BackendHealth.heard_from``)
        self._current: _Open | None = None  # the channel new requests go to
        self._channels: dict[str, _Open] = {}  # every open channel, retired ones included
        self._opening: asyncio.Future[None] | None = None
        self._refused_until = 0.0
        self._subscribers: dict[str, tuple[_Open, asyncio.Queue[Any]]] = {}
        self._closing: set[asyncio.Future[None]] = set()

    async def subscribe(self, request_id: str, queue: asyncio.Queue[Any]) -> str | None:
        """Subscribe ``request_id`` to the current channel (opening one if needed) and return its
        name: its entries go to ``queue``, and ``ChannelLost`` if the channel ends. None: no
        channel now, use a per-request stream. Pair with ``unsubscribe``."""
        if self._current is None:
            if time.monotonic() < self._refused_until:
                return None
            if self._opening is None or self._opening.done():
                self._opening = asyncio.ensure_future(self._open())
            # Shielded: a caller that goes away must not cancel the open the others wait for.
            await asyncio.shield(self._opening)
        channel = self._current  # read and joined with no await between: it cannot close under us
        if channel is None:
            return None
        channel.waiting.add(request_id)
        self._subscribers[request_id] = (channel, queue)
        return channel.name

    def unsubscribe(self, request_id: str) -> None:
        subscriber = self._subscribers.pop(request_id, None)
        if subscriber is None:
            return
        channel = subscriber[0]
        channel.waiting.discard(request_id)
        if channel.retired and not channel.waiting:
            self._close_later(channel)

    async def close(self) -> None:
        """Close every channel; see ``_close``."""
        self._current = None
        await asyncio.gather(*(self._close(channel) for channel in list(self._channels.values())))
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=CLOSE_WAIT_S)

    def _close_later(self, channel: _Open) -> None:
        self._channels.pop(channel.name, None)
        task = asyncio.ensure_future(self._close(channel))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, channel: _Open) -> None:
        """Ask the model to close the channel (``cancel_request`` with its name), which ends its
        stream with the final flag; a gRPC cancel only if that does not happen in time."""
        self._channels.pop(channel.name, None)
        reader = channel.reader
        if reader is None:
            return
        try:
            close = control_request(self._client, self._model_name, contract.CANCEL_REQUEST, channel.name, CLOSE_WAIT_S)
            await within(close, CLOSE_WAIT_S)
            await asyncio.wait({reader}, timeout=CLOSE_WAIT_S)
        except (InferenceServerException, grpc.RpcError, OSError, asyncio.TimeoutError) as exc:
            logger.info("closing response channel %s through the model failed: %r", channel.name, exc)
        if not reader.done():
            await channel.reads.cancel_when_idle(lambda _item: False)
            await asyncio.wait({reader}, timeout=CLOSE_WAIT_S)

    async def _open(self) -> None:
        name = f"frontend-{uuid.uuid4().hex}"

        async def request() -> AsyncIterator[dict[str, Any]]:
            yield {
                "model_name": self._model_name,
                "inputs": [contract_input(contract.OPEN_CHANNEL, contract.bytes_tensor(name))],
                "request_id": f"channel-{name}",
            }

        try:
            reads = GuardedReads(self._client.stream_infer(request()), on_item=self._heard)
        except InferenceServerException as exc:
            self._refuse(f"the stream could not start: {exc}", UNREACHABLE_RETRY_S)
            return
        try:
            _result, error = await within(reads.__anext__(), OPEN_TIMEOUT_S)
        except (StopAsyncIteration, asyncio.TimeoutError, grpc.RpcError, InferenceServerException) as exc:
            await reads.cancel_when_idle(lambda _item: False)
            self._refuse(repr(exc), UNREACHABLE_RETRY_S)
            return
        if error is not None:
            self._refuse(str(error), RETRY_S)  # an error is the call's last response: no cancel
            return
        channel = _Open(name, reads)
        channel.reader = asyncio.ensure_future(self._read(channel))
        self._channels[name] = channel
        previous, self._current = self._current, channel
        if previous is not None:
            self._retire(previous)
        logger.debug("response channel %s open", name)

    def _refuse(self, reason: str, retry_s: float) -> None:
        # An open that failed on the way is an outage, which ``client.health`` reports once.
        log = logger.info if retry_s == UNREACHABLE_RETRY_S else logger.warning
        log("no response channel (per-request streams for %g s): %s", retry_s, reason)
        self._refused_until = time.monotonic() + retry_s

    async def _read(self, channel: _Open) -> None:
        reason = "the model ended the channel"
        try:
            async for result, error in channel.reads:
                if error is not None:
                    reason = f"the channel failed: {error}"
                    break
                text = contract.read_string(outputs_by_name(result).get(contract.CHANNEL_DELTAS))
                if text:
                    self._dispatch(decode_entries(text))
                    self._count(channel)
        except grpc.RpcError as exc:
            reason = f"the channel's call failed: {exc.code() if isinstance(exc, grpc.aio.AioRpcError) else exc}"
        except ValueError as exc:  # a response we cannot read: nothing on this channel can be trusted
            reason = f"unreadable channel response: {exc}"
            await channel.reads.cancel_when_idle(lambda _item: False)
        finally:
            self._lost(channel, reason)

    def _count(self, channel: _Open) -> None:
        """Past ``ROTATE_AFTER`` responses, open the next channel in the background; requests keep
        joining this one until it is open (so no request waits for an open), then it retires."""
        channel.responses += 1
        due = channel.responses >= ROTATE_AFTER and channel is self._current
        opening = self._opening is not None and not self._opening.done()
        if due and not opening and time.monotonic() >= self._refused_until:
            self._opening = asyncio.ensure_future(self._open())

    def _retire(self, channel: _Open) -> None:
        channel.retired = True
        if not channel.waiting:
            self._close_later(channel)

    def _dispatch(self, entries: list[ChannelEntry]) -> None:
        for entry in entries:
            subscriber = self._subscribers.get(entry.request_id)
            if subscriber is not None:
                subscriber[1].put_nowait(entry)

    def _lost(self, channel: _Open, reason: str) -> None:
        if self._current is channel:
            self._current = None
        self._channels.pop(channel.name, None)
        log = logger.debug if channel.retired else logger.info
        log("response channel %s ended: %s", channel.name, reason)
        lost = ChannelLost(reason)
        for request_id in list(channel.waiting):
            subscriber = self._subscribers.pop(request_id, None)
            if subscriber is not None:
                subscriber[1].put_nowait(lost)
        channel.waiting.clear()
