"""``ChatBackend`` over Triton's gRPC streaming API: the only module that imports tritonclient.

Owns: turning a ``BackendRequest`` into the contract's input tensors (``build_infer_inputs``),
one ``ModelStreamInfer`` call per request (and per readiness probe), decoding each response into
a ``ChoiceDelta``, mapping Triton and gRPC failures to ``BackendError``, and cancelling the gRPC
call when the consumer stops early (client disconnect), so that Triton marks the request
cancelled and the engine frees the slot.

How the end of a request is detected: the request iterator yields one request and returns, which
half-closes the stream; Triton finishes the stream once that request's final flag is sent, so the
response iterator ends. A response flagged ``triton_final_response`` also ends it. The aio client rejects
``triton_``-prefixed request parameters, so ``enable_empty_final_response`` (a sync-client
argument) is not available here; the stream end covers a final flag sent without a response.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
import grpc
import numpy as np
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, InferInput, KeepAliveOptions
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from openai_frontend.client.base import BackendError, BackendRequest, backend_unavailable
from openai_frontend.client.channel import ChannelLost, ResponseChannel, control_request
from openai_frontend.client.reads import GuardedReads
from openai_frontend.client.results import contract_input, ends_stream, is_final, outputs_by_name
from openai_frontend.client.tokenize import ask_model
from openai_frontend.settings import FrontendSettings
from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry
from python_backend.protocol.errors import ErrorInfo, e2e_timeout
from python_backend.protocol.tokenize import DetokenizeAnswer, DetokenizeQuery, TokenizeAnswer, TokenizeQuery

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 2.0  # a readiness probe must answer well inside a Kubernetes probe period
# /health/ready needs no API key, and each answer costs the model a probe: callers within this
# long of the last answer share it, and concurrent callers share one probe in flight.
READY_REUSE_S = 0.5


def build_infer_inputs(req: BackendRequest) -> list[InferInput]:
    """The contract's input tensors for one request (names and datatypes from ``contract``)."""
    if req.prompt is not None or req.prompt_token_ids is not None:
        prompt = (
            contract_input(contract.TEXT_INPUT, contract.bytes_tensor(req.prompt))
            if req.prompt is not None
            else contract_input(contract.PROMPT_TOKEN_IDS, np.array(req.prompt_token_ids or (), dtype=np.int32))
        )
        # The prompt's echo is the frontend's to add (completions' ``echo``), never the model's.
        inputs = [prompt, contract_input(contract.EXCLUDE_INPUT_IN_OUTPUT, contract.bool_tensor(True))]
    else:
        inputs = [contract_input(contract.MESSAGES, contract.json_tensor(req.messages))]
    inputs += [
        contract_input(contract.PARAMETERS, contract.json_tensor(req.parameters)),
        contract_input(contract.STREAM, contract.bool_tensor(req.stream)),
    ]
    if req.counts_every_response:
        for name in (contract.RETURN_NUM_INPUT_TOKENS, contract.RETURN_NUM_OUTPUT_TOKENS):
            inputs.append(contract_input(name, contract.bool_tensor(True)))
    if req.media:
        inputs.append(contract_input(contract.MEDIA, np.array([data for data, _ in req.media], dtype=np.object_)))
        types = [mime.encode("utf-8") for _, mime in req.media]
        inputs.append(contract_input(contract.MEDIA_TYPES, np.array(types, dtype=np.object_)))
    return inputs


def probe_inputs() -> list[InferInput]:
    """The input tensors of the readiness probe (``contract.HEALTH_PROBE``)."""
    return [contract_input(contract.HEALTH_PROBE, contract.bool_tensor(True))]


def _rpc_error(exc: grpc.RpcError, timeout_s: float) -> BackendError:
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return BackendError(e2e_timeout(timeout_s))
    # Details (addresses, Triton internals) go to the log only.
    logger.warning("Triton call failed: %s", exc)
    return backend_unavailable()


CANCEL_WAIT_S = 1.0  # for the model's answer to a cancel_request, then for the request's end


class OwnStream:
    """A channel-bound request's own stream, read by a task of its own: it carries only an error
    (put on the queue as ``BackendError``) or the end; ``ended`` says the end came without one."""

    def __init__(self, reads: GuardedReads, queue: asyncio.Queue[Any], timeout_s: float) -> None:
        self.reads = reads
        self.ended = False
        self._queue = queue
        self._timeout_s = timeout_s
        self.task: asyncio.Future[None] = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        failed = False
        try:
            async for _result, error in self.reads:
                if error is not None and not failed:
                    failed = True  # the request's last response; read on to the stream's end
                    self._queue.put_nowait(BackendError(ErrorInfo.from_wire(str(error))))
        except grpc.RpcError as exc:
            if not failed:
                self._queue.put_nowait(_rpc_error(exc, self._timeout_s))
            return
        if not failed:
            self.ended = True
            self._queue.put_nowait(_STREAM_ENDED)

    async def last_entry(self) -> Any:
        """The next item once the stream ended: the model flushed the channel before it sent the
        final flag, so the last entry is at most a message behind; if it never comes, the answer is lost."""
        try:
            return await asyncio.wait_for(self._queue.get(), LAST_ENTRY_WAIT_S)
        except asyncio.TimeoutError:
            return ChannelLost("the request's stream ended without its last entry on the channel")


_STREAM_ENDED = object()
LAST_ENTRY_WAIT_S = 5.0


# Reconnect at most a second after tritonserver is back (gRPC's default backoff grows to 120 s):
# the launcher restarts a tritonserver whose model process died on the same port, and the first
# request after its model is ready should find the channel connected (the model restarts after a crash).
RECONNECT_BACKOFF_MS = 1000


def channel_args() -> list[tuple[str, Any]]:
    """tritonclient's own channel options (message sizes, keepalive) plus a short reconnect backoff."""
    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    ]


class HeaderClient:
    """The gRPC client with headers added to every call: a server started with restricted APIs
    (``--grpc-restricted-protocol``) answers only calls that carry its secret header."""

    def __init__(self, client: Any, headers: dict[str, str]) -> None:
        self._client = client  # tritonclient.grpc.aio.InferenceServerClient (or a stand-in)
        self._headers = dict(headers)

    def stream_infer(self, inputs_iterator: Any, stream_timeout: float | None = None) -> Any:
        return self._client.stream_infer(inputs_iterator, stream_timeout=stream_timeout, headers=self._headers)

    async def close(self) -> None:
        await self._client.close()


class TritonBackend:
    """A ``ChatBackend`` that calls one decoupled Triton model over gRPC."""

    def __init__(
        self, client: Any, model_name: str, request_timeout_s: float, channel: ResponseChannel | None = None
    ) -> None:
        """``channel``: streamed deltas come over it (``client/channel.py``); None: per request."""
        self._client = client  # tritonclient.grpc.aio.InferenceServerClient (or a stand-in in tests)
        self._model_name = model_name
        self._timeout_s = request_timeout_s
        self._channel = channel
        self._background: set[asyncio.Future[None]] = set()  # own streams read on to their end
        self._ready_answer: tuple[float, bool] | None = None  # (monotonic time, ready)
        self._ready_probe: asyncio.Future[bool] | None = None

    @classmethod
    def from_settings(cls, settings: FrontendSettings) -> TritonBackend:
        """Create the gRPC client; call from inside the event loop (grpc.aio channels bind to it)."""
        client: Any = InferenceServerClient(url=settings.triton_grpc_url, channel_args=channel_args())
        if settings.triton_headers:
            client = HeaderClient(client, settings.triton_headers)
        channel = ResponseChannel(client, settings.triton_model_name) if settings.response_channel else None
        return cls(client, settings.triton_model_name, settings.request_timeout_s, channel)

    def generate(self, req: BackendRequest) -> AsyncGenerator[contract.ChoiceDelta, None]:
        return self._stream(req)

    async def _stream(self, req: BackendRequest) -> AsyncGenerator[contract.ChoiceDelta, None]:
        channel, queue = self._channel, asyncio.Queue[Any]()
        channel_name = await channel.subscribe(req.request_id, queue) if channel is not None and req.stream else None
        try:
            if channel_name is None:
                deltas = self._generate(req)
            else:
                deltas = self._generate_on_channel(req, channel_name, queue)
            try:
                async for delta in deltas:
                    yield delta
            finally:
                await deltas.aclose()
        finally:
            if channel is not None and channel_name is not None:
                channel.unsubscribe(req.request_id)

    async def _requests(self, req: BackendRequest, channel_name: str | None = None) -> AsyncIterator[dict[str, Any]]:
        # Built here, inside the stream's own task, so a bad input surfaces as a stream error.
        inputs = build_infer_inputs(req)
        if channel_name is not None:
            inputs.append(contract_input(contract.STREAM_CHANNEL, contract.bytes_tensor(channel_name)))
        yield {"model_name": self._model_name, "inputs": inputs, "request_id": req.request_id}

    async def _generate(self, req: BackendRequest) -> AsyncGenerator[contract.ChoiceDelta, None]:
        try:
            responses = self._client.stream_infer(self._requests(req), stream_timeout=self._timeout_s)
        except InferenceServerException as exc:
            logger.warning("Triton stream could not start: %s", exc)
            raise backend_unavailable() from exc
        finished = False
        reads = GuardedReads(responses)
        try:
            async for result, error in reads:
                if finished:
                    continue  # drain: nothing after the final response belongs to this request
                if error is not None:
                    finished = True  # an error response is the request's last
                    raise BackendError(ErrorInfo.from_wire(str(error)))
                final = is_final(result)
                outputs = result.get_response().outputs
                if len(outputs) > 0:
                    delta = contract.decode_delta(outputs_by_name(result))
                    finished = final
                    yield delta
                finished = finished or final
                # After the final flag the stream ends by itself (our request iterator is done);
                # reading on to that end, rather than cancelling, matters: a cancel that reaches
                # Triton after the final response leaves the model unable to unload at shutdown.
        except grpc.RpcError as exc:
            raise _rpc_error(exc, self._timeout_s) from exc
        finally:
            if not finished:
                # The consumer left early (client disconnect) or the call failed: tell Triton to
                # cancel the request, so the engine frees the sequence at its next step.
                await reads.cancel_when_idle(ends_stream)

    async def _generate_on_channel(
        self, req: BackendRequest, channel_name: str, queue: asyncio.Queue[Any]
    ) -> AsyncGenerator[contract.ChoiceDelta, None]:
        """Deltas from the channel (through ``queue``, subscribed by the caller); errors and the
        end from the request's own stream."""
        try:
            responses = self._client.stream_infer(self._requests(req, channel_name), stream_timeout=self._timeout_s)
        except InferenceServerException as exc:
            logger.warning("Triton stream could not start: %s", exc)
            raise backend_unavailable() from exc
        own = OwnStream(GuardedReads(responses), queue, self._timeout_s)
        finished = False
        try:
            while True:
                item = await (queue.get() if not own.ended else own.last_entry())
                if isinstance(item, ChannelEntry):
                    finished = finished or item.last
                    if item.delta is not None:
                        yield item.delta
                    if item.last:
                        return
                elif isinstance(item, ChannelLost):
                    logger.warning("request %s lost its response channel: %s", req.request_id, item.reason)
                    raise backend_unavailable()
                elif isinstance(item, BackendError):
                    finished = True  # an error is the request's last response
                    raise item
        finally:
            if not finished:
                await self._cancel(req.request_id, own)
            self._background.add(own.task)  # reads on to the stream's end: no cancel after the final
            own.task.add_done_callback(self._background.discard)

    async def _cancel(self, request_id: str, own: OwnStream) -> None:
        """Ask the model to cancel the request (``cancel_request``) and wait for its stream to end;
        a gRPC cancel only if that does not work, since it would cancel under the read in flight
        (client/reads.py), and on a channel a request's own stream is silent until its end."""
        with anyio.CancelScope(shield=True):  # this runs while the consumer is being cancelled
            try:
                cancel = control_request(
                    self._client, self._model_name, contract.CANCEL_REQUEST, request_id, CANCEL_WAIT_S
                )
                await asyncio.wait_for(cancel, CANCEL_WAIT_S)
                await asyncio.wait({own.task}, timeout=CANCEL_WAIT_S)
            except (InferenceServerException, grpc.RpcError, OSError, asyncio.TimeoutError) as exc:
                logger.info("cancelling %s through the model failed: %r", request_id, exc)
            if not own.task.done():
                await own.reads.cancel_when_idle(ends_stream)

    async def tokenize(self, query: TokenizeQuery) -> TokenizeAnswer:
        return TokenizeAnswer.from_wire(await ask_model(self._client, self._model_name, query, self._timeout_s))

    async def detokenize(self, query: DetokenizeQuery) -> DetokenizeAnswer:
        return DetokenizeAnswer.from_wire(await ask_model(self._client, self._model_name, query, self._timeout_s))

    async def is_ready(self) -> bool:
        """Whether the model answers the health probe within ``READY_TIMEOUT_S``.

        A probe inference, not Triton's model readiness: Triton says READY for as long as the
        model is loaded, also when its process hangs or its engine loop died (``liveness.py``).
        """
        answer = self._ready_answer
        if answer is not None and time.monotonic() - answer[0] < READY_REUSE_S:
            return answer[1]
        if self._ready_probe is None or self._ready_probe.done():
            self._ready_probe = asyncio.ensure_future(self._answer_ready())
        # Shielded: a caller that goes away must not cancel the probe the others wait for.
        return await asyncio.shield(self._ready_probe)

    async def _answer_ready(self) -> bool:
        ready = await self._ask_ready()
        self._ready_answer = (time.monotonic(), ready)
        return ready

    async def _ask_ready(self) -> bool:
        try:
            problem = await asyncio.wait_for(self._probe(), READY_TIMEOUT_S + 0.5)
        except (InferenceServerException, grpc.RpcError, OSError, asyncio.TimeoutError) as exc:
            problem = repr(exc) if isinstance(exc, asyncio.TimeoutError) else str(exc)
        if problem is not None:
            logger.info("the model's health probe failed: %s", problem)
        return problem is None

    async def _probe(self) -> str | None:
        """None when the model answered the probe; otherwise what went wrong."""

        async def request() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": self._model_name, "inputs": probe_inputs(), "request_id": f"probe-{uuid.uuid4().hex}"}

        responses = self._client.stream_infer(request(), stream_timeout=READY_TIMEOUT_S)
        problem: str | None = "the stream ended without an answer"
        answered = False
        reads = GuardedReads(responses)
        try:
            async for result, error in reads:
                if answered:
                    continue  # read on to the stream's end: no cancel after the final response
                answered = error is not None or is_final(result)
                problem = None if error is None else str(error)
        finally:
            if not answered:
                await reads.cancel_when_idle(ends_stream)
        return problem

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        await self._client.close()
