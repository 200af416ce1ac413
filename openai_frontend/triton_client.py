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

import grpc
import numpy as np
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, InferInput, KeepAliveOptions
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from openai_frontend.backend import BackendError, BackendRequest, backend_unavailable
from openai_frontend.grpc_reads import GuardedReads
from openai_frontend.settings import FrontendSettings
from python_backend import contract

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 2.0  # a readiness probe must answer well inside a Kubernetes probe period
# /health/ready needs no API key, and each answer costs the model a probe: callers within this
# long of the last answer share it, and concurrent callers share one probe in flight.
READY_REUSE_S = 0.5


def _input(name: str, array: np.ndarray) -> InferInput:
    datatype = next(spec.datatype for spec in contract.INPUT_SPECS if spec.name == name)
    tensor = InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def build_infer_inputs(req: BackendRequest) -> list[InferInput]:
    """The contract's input tensors for one request (names and datatypes from ``contract``)."""
    inputs = [
        _input(contract.MESSAGES, contract.json_tensor(req.messages)),
        _input(contract.PARAMETERS, contract.json_tensor(req.parameters)),
        _input(contract.STREAM, contract.bool_tensor(req.stream)),
    ]
    if req.media:
        inputs.append(_input(contract.MEDIA, np.array([data for data, _ in req.media], dtype=np.object_)))
        types = [mime.encode("utf-8") for _, mime in req.media]
        inputs.append(_input(contract.MEDIA_TYPES, np.array(types, dtype=np.object_)))
    return inputs


def probe_inputs() -> list[InferInput]:
    """The input tensors of the readiness probe (``contract.HEALTH_PROBE``)."""
    return [_input(contract.HEALTH_PROBE, contract.bool_tensor(True))]


def e2e_timeout_error(seconds: float) -> contract.ErrorInfo:
    """MindIE's ``e2eTimeout`` ran out (the gRPC call's deadline)."""
    return contract.ErrorInfo(
        504, f"the request did not finish within the end-to-end timeout ({seconds:g} s)", "timeout", None, "timeout"
    )


def _rpc_error(exc: grpc.RpcError, timeout_s: float) -> BackendError:
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return BackendError(e2e_timeout_error(timeout_s))
    # Details (addresses, Triton internals) go to the log only.
    logger.warning("Triton call failed: %s", exc)
    return backend_unavailable()


def _single_bytes(raw: bytes) -> bytes | None:
    """The element of a one-element BYTES tensor in Triton's raw layout (4-byte little-endian
    length, then the bytes); None when the buffer holds anything else."""
    if len(raw) < 4:
        return None
    length = int.from_bytes(raw[:4], "little")
    return raw[4:] if len(raw) == 4 + length else None


def _outputs(result: Any) -> dict[str, np.ndarray | None]:
    """The response's outputs by name, read in one pass over the raw buffers.

    This runs once per streamed token; ``InferResult.as_numpy`` scans every output for each name
    it is asked for and deserializes BYTES tensors through a general loop. One-element BYTES
    tensors (every text and JSON output of the contract) are sliced directly; anything else goes
    through ``as_numpy``.
    """
    response = result.get_response()
    raw = response.raw_output_contents
    arrays: dict[str, np.ndarray | None] = {}
    for index, output in enumerate(response.outputs):
        if index < len(raw) and output.datatype == "BYTES" and list(output.shape) == [1]:
            value = _single_bytes(raw[index])
            if value is not None:
                arrays[output.name] = np.array([value], dtype=np.object_)
                continue
        arrays[output.name] = result.as_numpy(output.name)
    return arrays


def _is_final(result: Any) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and bool(params["triton_final_response"].bool_param)


def _ends_stream(item: tuple[Any, Any]) -> bool:
    """A ``(result, error)`` pair after which Triton sends nothing more for the request."""
    result, error = item
    return error is not None or _is_final(result)


# Reconnect at most a second after tritonserver is back (gRPC's default backoff grows to 120 s):
# the launcher restarts a tritonserver whose model process died on the same port, and the first
# request after its model is ready should find the channel connected (RELIABILITY C6).
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


class TritonBackend:
    """A ``ChatBackend`` that calls one decoupled Triton model over gRPC."""

    def __init__(self, client: Any, model_name: str, request_timeout_s: float) -> None:
        self._client = client  # tritonclient.grpc.aio.InferenceServerClient (or a stand-in in tests)
        self._model_name = model_name
        self._timeout_s = request_timeout_s
        self._ready_answer: tuple[float, bool] | None = None  # (monotonic time, ready)
        self._ready_probe: asyncio.Future[bool] | None = None

    @classmethod
    def from_settings(cls, settings: FrontendSettings) -> TritonBackend:
        """Create the gRPC client; call from inside the event loop (grpc.aio channels bind to it)."""
        client = InferenceServerClient(url=settings.triton_grpc_url, channel_args=channel_args())
        return cls(client, settings.triton_model_name, settings.request_timeout_s)

    def generate(self, req: BackendRequest) -> AsyncGenerator[contract.ChoiceDelta, None]:
        return self._generate(req)

    async def _requests(self, req: BackendRequest) -> AsyncIterator[dict[str, Any]]:
        # Built here, inside the stream's own task, so a bad input surfaces as a stream error.
        yield {"model_name": self._model_name, "inputs": build_infer_inputs(req), "request_id": req.request_id}

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
                    raise BackendError(contract.ErrorInfo.from_wire(str(error)))
                final = _is_final(result)
                outputs = result.get_response().outputs
                if len(outputs) > 0:
                    delta = contract.decode_delta(_outputs(result))
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
                await reads.cancel_when_idle(_ends_stream)

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
                answered = error is not None or _is_final(result)
                problem = None if error is None else str(error)
        finally:
            if not answered:
                await reads.cancel_when_idle(_ends_stream)
        return problem

    async def close(self) -> None:
        await self._client.close()
