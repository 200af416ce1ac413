"""Scripted stand-ins for the tritonclient gRPC aio client, for the frontend's client tests.

``FakeStream`` is a response stream as ``stream_infer`` returns it (an async iterator of
``(result, error)`` tuples with ``cancel()``): fed from a list (it ends when the list does) or
through its queue (``END`` ends it); each read may take ``delay_s``; it records how reads and the
call ended. ``FakeClient`` answers every ``stream_infer`` with a stream over the same items and
records what was sent. ``ChannelModel`` answers as the model does when response channels are on:
``open_channel``, requests that name a channel in ``stream_channel``, and ``cancel_request``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor, serialize_byte_tensor

from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry, encode_entries
from python_backend.protocol.contract import ChoiceDelta

END = object()  # put on a fed stream's queue: the stream ends there


class FakeStream:
    """A response stream; items that are exceptions are raised by the read that reaches them."""

    def __init__(self, items: list[Any] | None = None, delay_s: float = 0.0) -> None:
        """``items``: what the reads return, then the end; None: fed through ``queue``."""
        self.items = items
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.delay_s = delay_s
        self.cancelled = False
        self.reading = False
        self.reads_cancelled = 0
        self.cancelled_while_reading = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Any:
        if self.items is not None and not self.items:
            raise StopAsyncIteration
        self.reading = True
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            item = self.items.pop(0) if self.items is not None else await self.queue.get()
        except asyncio.CancelledError:
            self.reads_cancelled += 1
            raise
        finally:
            self.reading = False
        if item is END:
            self.queue.put_nowait(END)  # every later read ends too
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> bool:
        self.cancelled = True
        self.cancelled_while_reading = self.reading
        if self.items is None:
            self.queue.put_nowait(asyncio.CancelledError())  # as grpc.aio fails the read in flight
        return True


@dataclass
class FakeClient:
    """Every call streams ``items`` (a copy each), each read after ``delay_s``."""

    items: list[Any]
    delay_s: float = 0.0
    sent: list[dict[str, Any]] = field(default_factory=list)
    streams: list[FakeStream] = field(default_factory=list)
    start_error: BaseException | None = None  # raised by stream_infer itself
    drains: list[asyncio.Future[None]] = field(default_factory=list)
    closed: bool = False

    def stream_infer(
        self, inputs_iterator: AsyncIterator[dict[str, Any]], stream_timeout: float | None = None
    ) -> FakeStream:
        async def drain() -> None:
            async for request in inputs_iterator:
                self.sent.append({**request, "stream_timeout": stream_timeout})

        if self.start_error is not None:
            raise self.start_error
        # grpc.aio consumes the request iterator in the background; so does this stand-in.
        self.drains.append(asyncio.ensure_future(drain()))
        stream = FakeStream(list(self.items), self.delay_s)
        self.streams.append(stream)
        return stream

    async def close(self) -> None:
        self.closed = True


def text_response(outputs: dict[str, str], final: bool) -> InferResult:
    """A real ``InferResult`` carrying BYTES outputs, as Triton sends them."""
    response = service_pb2.ModelInferResponse()
    for name, text in outputs.items():
        output = response.outputs.add()
        output.name, output.datatype = name, "BYTES"
        output.shape.append(1)
        response.raw_output_contents.append(serialize_byte_tensor(contract.bytes_tensor(text)).item())
    response.parameters["triton_final_response"].bool_param = final
    return InferResult(response)


def _inputs(request: dict[str, Any]) -> dict[str, str]:
    return {
        t.name(): deserialize_bytes_tensor(t._get_content())[0].decode()
        for t in request["inputs"]
        if t.datatype() == "BYTES" and t.name() != contract.MESSAGES and t.name() != contract.PARAMETERS
    }


@dataclass
class ChannelModel:
    """Answers open_channel, stream_channel requests and cancel_request like triton_model does."""

    refuse_channels: bool = False
    channels: list[FakeStream] = field(default_factory=list)
    names: dict[str, FakeStream] = field(default_factory=dict)
    bound: dict[str, FakeStream] = field(default_factory=dict)  # request id -> its channel's stream
    requests: dict[str, FakeStream] = field(default_factory=dict)
    plain: list[str] = field(default_factory=list)  # requests sent without a channel
    cancels: list[str] = field(default_factory=list)

    async def close(self) -> None:
        pass

    def stream_infer(
        self, inputs_iterator: AsyncIterator[dict[str, Any]], stream_timeout: float | None = None
    ) -> FakeStream:
        stream = FakeStream()
        asyncio.ensure_future(self._serve(inputs_iterator, stream))
        return stream

    async def _serve(self, inputs_iterator: AsyncIterator[dict[str, Any]], stream: FakeStream) -> None:
        async for request in inputs_iterator:
            named = _inputs(request)
            if contract.OPEN_CHANNEL in named:
                if self.refuse_channels:
                    error = InferenceServerException(msg="unexpected inference input 'open_channel'")
                    stream.queue.put_nowait((None, error))
                    stream.queue.put_nowait(END)
                    return
                self.channels.append(stream)
                self.names[named[contract.OPEN_CHANNEL]] = stream
                opened = text_response({contract.TEXT_OUTPUT: named[contract.OPEN_CHANNEL]}, False)
                stream.queue.put_nowait((opened, None))
            elif contract.CANCEL_REQUEST in named:
                target = named[contract.CANCEL_REQUEST]
                self.cancels.append(target)
                if target in self.requests:
                    self.send(target, None, last=True)
                elif target in self.names:  # the frontend closes its channel
                    channel = self.names.pop(target)
                    channel.queue.put_nowait((text_response({}, True), None))
                    channel.queue.put_nowait(END)
                stream.queue.put_nowait((text_response({}, True), None))
                stream.queue.put_nowait(END)
            elif contract.STREAM_CHANNEL in named:
                self.requests[request["request_id"]] = stream
                self.bound[request["request_id"]] = self.names[named[contract.STREAM_CHANNEL]]
            else:
                self.plain.append(request["request_id"])

    def send(self, request_id: str, delta: ChoiceDelta | None, last: bool = False) -> None:
        """One pass's entry for one request on the open channel (and its own end if last)."""
        self.send_pass([ChannelEntry(request_id, delta, last)])

    def send_pass(self, entries: list[ChannelEntry]) -> None:
        channel = self.bound[entries[0].request_id]
        deltas = text_response({contract.CHANNEL_DELTAS: encode_entries(entries)}, False)
        channel.queue.put_nowait((deltas, None))
        for entry in entries:
            if entry.last:
                own = self.requests.pop(entry.request_id)
                own.queue.put_nowait((text_response({}, True), None))
                own.queue.put_nowait(END)

    async def sent(self, count: int) -> None:
        for _ in range(200):
            if len(self.requests) >= count:
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"{count} requests never reached the model")
