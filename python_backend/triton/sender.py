"""The model's sending side: one thread that turns engine events into Triton responses.

Owns ``ResponseSender`` (the sender thread: it gathers each engine pass's events, sends one
response per response channel and the rest on the requests' own streams, and watches open channels
for cancellation), ``ResponseLink`` (one request's response sender, safe against asking Triton
about a request that has ended) and ``end_channel`` (a closed channel's final flag). The engine
only enqueues, so a slow client never stalls the step loop.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import triton_python_backend_utils as pb_utils

from python_backend.protocol import contract
from python_backend.protocol.channel_wire import encode_entries
from python_backend.triton.channels import CANCEL_CHECK_S, Channel, ChannelRegistry, Outgoing, plan_delivery

logger = logging.getLogger("triton_chat")

_PASS_END = object()  # the engine finished a pass: its events so far are one burst
_CLOSE_ALL = object()  # the model stops: end every open channel
# The longest a channel's deltas wait for the end of their pass (normally well under 1 ms).
_PASS_WAIT_S = 0.005


class ResponseLink:
    """One request's response sender, safe to ask about cancellation from any thread.

    Triton frees a request's response factory once its final response is sent; asking
    ``is_cancelled()`` after that reads freed memory in the server (a crash seen when the
    cancellation watcher asked about a request that had just finished). The final send and every
    cancellation question take this lock, and nothing is asked once the final response went out.
    """

    def __init__(self, sender: Any) -> None:
        self._sender = sender  # pb_utils.InferenceResponseSender
        self._lock = threading.Lock()
        self._closed = False

    def is_cancelled(self) -> bool:
        with self._lock:
            return False if self._closed else bool(self._sender.is_cancelled())

    def send(self, response: Any = None, flags: int = 0) -> None:
        if not flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._send(response, flags)
            return
        with self._lock:
            if self._closed:
                raise RuntimeError("the final response was already sent")
            self._closed = True  # even if the send fails: the request is over either way
            self._send(response, flags)

    def _send(self, response: Any, flags: int) -> None:
        if response is None:
            self._sender.send(flags=flags)  # a flags-only response: the end of the stream
        else:
            self._sender.send(response, flags=flags)


@dataclass(frozen=True)
class _CloseChannel:
    channel: Channel


class ResponseSender:
    """One thread that sends every response; the engine only enqueues.

    Events are gathered per engine pass (the engine puts ``_PASS_END`` after each), so that every
    channel gets one response per pass (``channels.py``); responses for requests without
    a channel go out as soon as the queue is momentarily empty, as before.
    """

    def __init__(self, channels: ChannelRegistry) -> None:
        self._channels = channels
        self._queue: queue.SimpleQueue[Outgoing | object | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="triton-chat-sender", daemon=True)
        self._thread.start()

    def put(self, item: Outgoing) -> None:
        self._queue.put(item)

    def pass_ended(self) -> None:
        self._queue.put(_PASS_END)

    def close_later(self, channel: Channel) -> None:
        """Close a channel from another thread: at once for its requests (``closed``), and on this
        thread for its link, so that no send on it runs beside its final one."""
        channel.closed = True
        self._queue.put(_CloseChannel(channel))

    def stop(self) -> None:
        """Send what is queued, end every open channel, and stop the thread.

        The channels' final flags go from this thread too: a final sent from another thread
        while this one is still sending on the same channel is two sends at once on one
        response sender, which the stub does not guard (its final frees the response factory
        that the other send is using)."""
        self._queue.put(_CLOSE_ALL)
        self._queue.put(None)
        self._thread.join(10)
        if self._thread.is_alive():
            logger.error("the sender thread did not stop in 10 s; its open channels are left to Triton")

    def _run(self) -> None:
        pending: list[Outgoing] = []
        for_pass = False  # a pending item goes to a channel: wait for the pass to end
        while True:
            try:
                if pending and not for_pass:
                    item = self._queue.get(block=False)
                else:
                    item = self._queue.get(timeout=_PASS_WAIT_S if for_pass else CANCEL_CHECK_S)
            except queue.Empty:
                item = _PASS_END  # nothing more came: send what there is
            if isinstance(item, Outgoing):
                pending.append(item)
                for_pass = for_pass or item.channel is not None
                continue
            try:
                self._deliver(pending)
                if isinstance(item, _CloseChannel):
                    self.close_channel(item.channel)
                elif item is _CLOSE_ALL:
                    for channel in self._channels.close_all():
                        end_channel(channel)
                self._check_channels()
            except Exception:  # a bug here must not stop every response of every request
                logger.exception("delivering %d responses failed", len(pending))
            pending, for_pass = [], False
            if item is None:
                return

    def _deliver(self, items: list[Outgoing]) -> None:
        if not items:
            return
        delivery = plan_delivery(items)
        for channel, entries in delivery.batches:
            output = pb_utils.Tensor(contract.CHANNEL_DELTAS, contract.bytes_tensor(encode_entries(entries)))
            try:
                channel.link.send(pb_utils.InferenceResponse(output_tensors=[output]))
            except Exception:  # its caller is gone: its requests are cancelled through `closed`
                logger.exception("sending on response channel %s failed; closing it", channel.name)
                self.close_channel(channel)
        for item in delivery.direct:
            try:
                _send(item)
            except Exception:  # the client may be gone; the other requests go on
                logger.exception("sending a response for %s failed", item.event.request_id)

    def _check_channels(self) -> None:
        for channel in self._channels.due_for_check(time.monotonic()):
            try:
                cancelled = channel.link.is_cancelled()
            except Exception:  # a transport that cannot answer cannot deliver either
                logger.exception("asking response channel %s about cancellation failed", channel.name)
                cancelled = True
            if cancelled:
                logger.info("response channel %s was cancelled by its caller; closing it", channel.name)
                self.close_channel(channel)

    def close_channel(self, channel: Channel) -> None:
        if self._channels.close(channel):
            end_channel(channel)


def end_channel(channel: Channel) -> None:
    """Send a closed channel's final flag (its caller's stream then ends)."""
    try:
        channel.link.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    except Exception:  # the caller is gone already; the channel is closed either way
        logger.exception("ending response channel %s failed", channel.name)


def _send(item: Outgoing) -> None:
    event = item.event
    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if event.final else 0
    if event.error is not None:
        response = pb_utils.InferenceResponse(error=pb_utils.TritonError(event.error.to_wire()))
        item.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return
    if event.delta is None:
        item.sender.send(flags=flags)
        return
    delta = event.delta
    if item.echo_prompt:
        delta.text = item.echo_prompt + delta.text
    encoded = item.vllm.encode(delta) if item.vllm is not None else contract.encode_delta(delta, item.counts)
    tensors = [pb_utils.Tensor(name, array) for name, array in encoded.items()]
    item.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)
