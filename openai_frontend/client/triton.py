"""``ChatBackend`` over Triton's gRPC streaming API (tritonclient stays inside ``openai_frontend.client``).

Owns: turning a ``BackendRequest`` into the contract's input tensors (``build_infer_inputs``),
one ``ModelStreamInfer`` call per request (and per readiness probe), decoding each response into
a ``ChoiceDelta``, mapping Triton and gRPC failures to ``BackendError``, and cancelling the gRPC
call when the consumer stops early (client disconnect), so that Triton marks the request
cancelled and the engine frees the slot. While ``client.health`` says tritonserver does not answer,
every call fails at once with 503 ``backend_unavailable``, and calls in flight fail when it
starts to say so.

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
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import anyio
import grpc
import numpy as np
from tritonclient.grpc import InferInput
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from openai_frontend.aio import within
from openai_frontend.client.base import BackendError, BackendRequest, backend_unavailable
from openai_frontend.client.channel import ChannelLost, ResponseChannel, control_request
from openai_frontend.client.connection import channel_args, live_probe, rpc_summary
from openai_frontend.client.health import BackendHealth
from openai_frontend.client.own_stream import OwnStream, rpc_error
from openai_frontend.client.reads import GuardedReads, ReadsStopped
from openai_frontend.client.results import contract_input, ends_stream, is_final, outputs_by_name
from openai_frontend.client.tokenize import ask_model
from openai_frontend.settings import FrontendSettings
from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry
from python_backend.protocol.errors import ErrorInfo
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


CANCEL_WAIT_S = 1.0  # for the model's answer to a cancel_request, then for the request's end


_BACKEND_DOWN = object()  # put on a channel request's queue when the backend goes down


class TritonBackend:
    """A ``ChatBackend`` that calls one decoupled Triton model over gRPC."""

    def __init__(
        self,
        client: Any,
        model_name: str,
        request_timeout_s: float,
        channel: ResponseChannel | None = None,
        health: BackendHealth | None = None,
    ) -> None:
        """``channel``: streamed deltas come over it (``client/channel.py``); None: per request.
        ``health``: while it says down, calls fail at once with 503 (``client/health.py``)."""
        self._client = client  # tritonclient.grpc.aio.InferenceServerClient (or a stand-in in tests)
        self._model_name = model_name
        self._timeout_s = request_timeout_s
        self._channel = channel
        self._health = health
        self._background: set[asyncio.Future[None]] = set()  # own streams read on to their end
        self._ready_answer: tuple[float, bool] | None = None  # (monotonic time, ready)
        self._ready_probe: asyncio.Future[bool] | None = None

    @classmethod
    def from_settings(
        cls, settings: FrontendSettings, on_health_change: Callable[[bool], None] | None = None
    ) -> TritonBackend:
        """Create the gRPC client and start probing it; call from inside the event loop (grpc.aio
        channels bind to it). ``on_health_change(up)``: each change of the backend's state."""
        client: Any = InferenceServerClient(url=settings.triton_grpc_url, channel_args=channel_args())
        health = BackendHealth(live_probe(client), settings.backend_probe_interval_s, on_health_change)
        channel = (
            ResponseChannel(client, settings.triton_model_name, health.heard_from)
            if settings.response_channel
            else None
        )
        health.start()
        return cls(client, settings.triton_model_name, settings.request_timeout_s, channel, health)

    def generate(self, req: BackendRequest) -> AsyncGenerator[contract.ChoiceDelta, None]:
        return self._stream(req)

    def _heard(self) -> None:
        if self._health is not None:
            self._health.heard_from()

    def _down_signal(self) -> asyncio.Future[None] | None:
        """What a new call waits on besides its answer (None: no health kept); while the backend
        is down, the 503 at once."""
        if self._health is None:
            return None
        if not self._health.up:
            raise backend_unavailable()
        return self._health.down_signal()

    async def _stream(self, req: BackendRequest) -> AsyncGenerator[contract.ChoiceDelta, None]:
        down = self._down_signal()
        channel, queue = self._channel, asyncio.Queue[Any]()
        channel_name = await self._subscribe(channel, req.request_id, queue, down) if channel and req.stream else None
        try:
            if channel_name is None:
                deltas = self._generate(req, down)
            else:
                deltas = self._generate_on_channel(req, channel_name, queue, down)
            try:
                async for delta in deltas:
                    yield delta
            finally:
                await deltas.aclose()
        finally:
            if channel is not None and channel_name is not None:
                channel.unsubscribe(req.request_id)

    @staticmethod
    async def _subscribe(
        channel: ResponseChannel, request_id: str, queue: asyncio.Queue[Any], down: asyncio.Future[None] | None
    ) -> str | None:
        """``channel.subscribe``, or the 503 when the backend goes down while a channel opens."""
        if down is None:
            return await channel.subscribe(request_id, queue)
        task = asyncio.ensure_future(channel.subscribe(request_id, queue))
        try:
            await asyncio.wait((task, down), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():  # left before the open ended: drop the subscription it makes
                task.add_done_callback(lambda opened: _drop_subscription(channel, request_id, opened))
        if not task.done():
            raise backend_unavailable()
        return task.result()

    async def _requests(self, req: BackendRequest, channel_name: str | None = None) -> AsyncIterator[dict[str, Any]]:
        # Built here, inside the stream's own task, so a bad input surfaces as a stream error.
        inputs = build_infer_inputs(req)
        if channel_name is not None:
            inputs.append(contract_input(contract.STREAM_CHANNEL, contract.bytes_tensor(channel_name)))
        yield {"model_name": self._model_name, "inputs": inputs, "request_id": req.request_id}

    async def _generate(
        self, req: BackendRequest, down: asyncio.Future[None] | None
    ) -> AsyncGenerator[contract.ChoiceDelta, None]:
        try:
            responses = self._client.stream_infer(self._requests(req), stream_timeout=self._timeout_s)
        except InferenceServerException as exc:
            logger.warning("Triton stream could not start: %s", rpc_summary(exc))
            raise backend_unavailable() from exc
        finished = False
        reads = GuardedReads(responses, down, self._heard)
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
            raise rpc_error(exc, self._timeout_s, self._health) from exc
        except ReadsStopped as exc:  # the backend went down: the call is cancelled below
            raise backend_unavailable() from exc
        finally:
            if not finished:
                # The consumer left early (client disconnect) or the call failed: tell Triton to
                # cancel the request, so the engine frees the sequence at its next step.
                await reads.cancel_when_idle(ends_stream)

    async def _generate_on_channel(
        self, req: BackendRequest, channel_name: str, queue: asyncio.Queue[Any], down: asyncio.Future[None] | None
    ) -> AsyncGenerator[contract.ChoiceDelta, None]:
        """Deltas from the channel (through ``queue``, subscribed by the caller); errors and the
        end from the request's own stream; ``_BACKEND_DOWN`` when ``down`` completes."""
        try:
            responses = self._client.stream_infer(self._requests(req, channel_name), stream_timeout=self._timeout_s)
        except InferenceServerException as exc:
            logger.warning("Triton stream could not start: %s", rpc_summary(exc))
            raise backend_unavailable() from exc
        own = OwnStream(GuardedReads(responses, on_item=self._heard), queue, self._timeout_s, self._health)
        finished = False

        def wake(_down: asyncio.Future[None]) -> None:
            queue.put_nowait(_BACKEND_DOWN)

        if down is not None:
            down.add_done_callback(wake)
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
                    # Each request in flight on the channel: one line each, and the health decides
                    # whether tritonserver is gone (its one warning).
                    logger.info("request %s lost its response channel: %s", req.request_id, item.reason)
                    if self._health is not None:
                        self._health.suspect()
                    raise backend_unavailable()
                elif isinstance(item, BackendError):
                    finished = True  # an error is the request's last response
                    raise item
                elif item is _BACKEND_DOWN:
                    raise backend_unavailable()
        finally:
            if down is not None:
                down.remove_done_callback(wake)
            if not finished:
                await self._cancel(req.request_id, own)
            self._background.add(own.task)  # reads on to the stream's end: no cancel after the final
            own.task.add_done_callback(self._background.discard)

    async def _cancel(self, request_id: str, own: OwnStream) -> None:
        """Ask the model to cancel the request (``cancel_request``) and wait for its stream to end;
        a gRPC cancel only if that does not work, since it would cancel under the read in flight
        (client/reads.py), and on a channel a request's own stream is silent until its end."""
        with anyio.CancelScope(shield=True):  # this runs while the consumer is being cancelled
            if self._health is not None and not self._health.up:
                # Nobody would answer the model's cancel: cancel the call (Triton sees it when back).
                await own.reads.cancel_when_idle(ends_stream)
                return
            try:
                cancel = control_request(
                    self._client, self._model_name, contract.CANCEL_REQUEST, request_id, CANCEL_WAIT_S
                )
                await within(cancel, CANCEL_WAIT_S)
                await asyncio.wait({own.task}, timeout=CANCEL_WAIT_S)
            except (InferenceServerException, grpc.RpcError, OSError, asyncio.TimeoutError) as exc:
                logger.info("cancelling %s through the model failed: %r", request_id, exc)
            if not own.task.done():
                await own.reads.cancel_when_idle(ends_stream)

    async def tokenize(self, query: TokenizeQuery) -> TokenizeAnswer:
        return TokenizeAnswer.from_wire(await self._ask(query))

    async def detokenize(self, query: DetokenizeQuery) -> DetokenizeAnswer:
        return DetokenizeAnswer.from_wire(await self._ask(query))

    async def _ask(self, query: TokenizeQuery | DetokenizeQuery) -> str:
        """``ask_model``, or the 503 at once while the backend is down or when it goes down."""
        down = self._down_signal()
        if down is None:
            return await ask_model(self._client, self._model_name, query, self._timeout_s)
        task = asyncio.ensure_future(ask_model(self._client, self._model_name, query, self._timeout_s))
        try:
            await asyncio.wait((task, down), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():  # the backend went down, or our caller left: grpc.aio cancels the call
                task.cancel()
        if not task.done() or task.cancelled():
            raise backend_unavailable()
        return task.result()

    async def is_ready(self) -> bool:
        """Whether the model answers the health probe within ``READY_TIMEOUT_S``.

        A probe inference, not Triton's model readiness: Triton says READY for as long as the
        model is loaded, also when its process hangs or its engine loop died (``liveness.py``).
        """
        if self._health is not None and not self._health.up:
            return False  # tritonserver does not answer at all: no probe inference to wait for
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
            problem = await within(self._probe(), READY_TIMEOUT_S + 0.5)
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
        reads = GuardedReads(responses, on_item=self._heard)
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
        if self._health is not None:
            await self._health.close()
        if self._channel is not None:
            await self._channel.close()
        await self._client.close()


def _drop_subscription(channel: ResponseChannel, request_id: str, subscribed: asyncio.Future[str | None]) -> None:
    """Unsubscribe a request that left while its channel opened (``subscribe`` never raises:
    the open's failures are the channel's to handle)."""
    if not subscribed.cancelled() and subscribed.exception() is None:
        channel.unsubscribe(request_id)
