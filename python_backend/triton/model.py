"""The Triton Python-backend adapter: the only importer of ``triton_python_backend_utils``.

Owns: ``TritonPythonModel`` (decoupled): ``initialize`` loads the model and starts the engine;
``execute`` decodes and submits each request and returns at once; a sender thread turns engine
events into responses, so a slow client never stalls the step loop; ``finalize`` stops both.
Every request ends with exactly one ``COMPLETE_FINAL``: on success, on error and on cancel.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import triton_python_backend_utils as pb_utils

from python_backend.engine.engine import Engine
from python_backend.engine.liveness import health_problem
from python_backend.engine.sequence import EngineEvent, EngineRequest
from python_backend.model.loader import load_model
from python_backend.model.threads import confine_serving_threads, pinned_cpus, serialize_current_thread
from python_backend.prompt.inputs import decode_request
from python_backend.protocol import contract
from python_backend.protocol.channel_wire import encode_entries
from python_backend.protocol.errors import ContractError, ErrorInfo, internal
from python_backend.protocol.settings import EngineSettings
from python_backend.sampling.structured import GrammarCompiler
from python_backend.text.output_formats import resolve_formats
from python_backend.triton.channels import CANCEL_CHECK_S, Channel, ChannelRegistry, Outgoing, plan_delivery
from python_backend.triton.metrics import MetricsReporter

logger = logging.getLogger("triton_chat")

_INTERNAL = internal("internal error while reading the request")
_PASS_END = object()  # the engine finished a pass: its events so far are one burst
# How often a channel-bound request's Triton cancellation flag is asked (see _submit).
CHANNEL_REQUEST_POLL_S = 0.5
# The longest a channel's deltas wait for the end of their pass (normally well under 1 ms).
_PASS_WAIT_S = 0.005


class _ResponseLink:
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


class _ResponseSender:
    """One thread that sends every response; the engine only enqueues.

    Events are gathered per engine pass (the engine puts ``_PASS_END`` after each), so that every
    channel gets one response per pass (``triton/channels.py``); responses for requests without
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
        self._queue.put(None)
        self._thread.join(10)

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
            _end_channel(channel)


def _end_channel(channel: Channel) -> None:
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
    tensors = [pb_utils.Tensor(name, array) for name, array in contract.encode_delta(delta, item.counts).items()]
    item.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)


def _is_probe(request: Any) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, contract.HEALTH_PROBE)
    return tensor is not None and contract.read_bool(tensor.as_numpy(), default=False)


def _string_input(request: Any, name: str) -> str | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else contract.read_string(tensor.as_numpy())


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("triton-chat needs model_transaction_policy { decoupled: true }")
        raw = {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}
        settings = EngineSettings.from_parameters(raw)
        # This (stub) thread must not start an OpenMP team next to the engine's (model/threads.py).
        threads = serialize_current_thread()
        settings = dataclasses.replace(settings, torch_threads=settings.torch_threads or threads)
        loaded = load_model(settings)
        self._tokenizer = loaded.tokenizer
        self._adapters = loaded.adapters
        self._media = loaded.media
        self._formats = resolve_formats(
            settings.tool_call_parser, settings.reasoning_parser, loaded.tokenizer, loaded.model_type
        )
        logger.info(
            "tool-call format: %s; reasoning format: %s",
            self._formats.tool_parser or "none",
            "<think>" if self._formats.reasoning else "none",
        )
        self._grammars = GrammarCompiler(loaded.tokenizer, loaded.vocab_size)
        cpus = pinned_cpus(settings.torch_threads, loaded.device.type == "cpu", settings.cpu_bind_threads)
        if cpus is not None:
            confine_serving_threads(cpus[0])
            logger.info("compute threads pinned to CPUs %s; the stub's other threads share CPU %d", cpus, cpus[0])
        self._channels = ChannelRegistry()
        self._sender = _ResponseSender(self._channels)
        self._engine = Engine(loaded, settings, compute_cpus=cpus, after_pass=self._sender.pass_ended)
        self._engine.start()
        self._metrics = MetricsReporter(self._engine, loaded.name, pb_utils)
        logger.info("triton-chat model '%s' ready", loaded.name)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = _ResponseLink(request.get_response_sender())
            request_id = request.request_id() or uuid.uuid4().hex
            try:
                if _is_probe(request):
                    self._answer_probe(sender, request_id)
                    continue
                target = _string_input(request, contract.CANCEL_REQUEST)
                if target is not None:
                    self._cancel(target)
                    self._sender.put(Outgoing(sender, EngineEvent(request_id, final=True)))
                    continue
                channel_name = _string_input(request, contract.OPEN_CHANNEL)
                if channel_name is not None:
                    self._open_channel(sender, request_id, channel_name)
                    continue
                self._submit(request, sender, request_id)
            except ContractError as exc:
                self._fail(sender, request_id, exc.info)
            except Exception:
                logger.exception("request %s could not be read", request_id)
                self._fail(sender, request_id, _INTERNAL)
        return None

    def _submit(self, request: Any, sender: _ResponseLink, request_id: str) -> None:
        def get(name: str) -> Any:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        channel_name = _string_input(request, contract.STREAM_CHANNEL)
        channel = self._channels.find(channel_name) if channel_name is not None else None
        prepared = decode_request(get, self._tokenizer, self._adapters, self._formats, self._media)
        response_format = prepared.params.response_format
        grammar = self._grammars.compile(response_format) if response_format is not None else None
        echo, counts = prepared.echo_prompt, prepared.counts

        def sink(event: EngineEvent) -> None:
            self._sender.put(Outgoing(sender, event, echo, counts, channel))

        asked = [0.0]

        def is_cancelled() -> bool:
            if channel is None:
                return sender.is_cancelled()
            # A closed channel has nowhere to deliver to: its requests stop too. The caller of a
            # channel cancels with ``cancel_request`` (seen at the next step), so Triton's own
            # flag, a round trip each time, is only the fallback, asked less often.
            now = time.monotonic()
            if channel.closed or now - asked[0] < CHANNEL_REQUEST_POLL_S:
                return channel.closed
            asked[0] = now
            return sender.is_cancelled()

        self._engine.submit(
            EngineRequest(
                request_id=request_id,
                prompt_ids=prepared.prompt_ids,
                params=prepared.params,
                sink=sink,
                is_cancelled=is_cancelled,
                stream=prepared.stream,
                output=prepared.output,
                grammar=grammar,
                media=prepared.media,
            )
        )

    def _answer_probe(self, sender: _ResponseLink, request_id: str) -> None:
        # Through the sender thread like any response, so a stuck sender fails the probe too.
        health = self._engine.health()
        problem = health_problem(health)
        if problem is not None:
            self._fail(sender, request_id, problem)
            return
        delta = contract.ChoiceDelta(index=0, text=health.to_json())
        self._sender.put(Outgoing(sender, EngineEvent(request_id, delta=delta, final=True)))

    def _cancel(self, target: str) -> None:
        """``cancel_request``: a request id, or an open channel's name (its caller is done with it)."""
        channel = self._channels.get(target)
        if channel is not None:
            logger.info("response channel %s closed by its caller", target)
            self._sender.close_later(channel)
        else:
            self._engine.cancel(target, before_arrival=True)

    def _open_channel(self, sender: _ResponseLink, request_id: str, name: str) -> None:
        self._channels.open(name, sender)
        logger.info("response channel %s open", name)
        # The first response says the channel is open: its text is the channel's name.
        delta = contract.ChoiceDelta(index=0, text=name)
        self._sender.put(Outgoing(sender, EngineEvent(request_id, delta=delta)))

    def _fail(self, sender: _ResponseLink, request_id: str, info: ErrorInfo) -> None:
        self._sender.put(Outgoing(sender, EngineEvent(request_id, error=info, final=True)))

    def finalize(self) -> None:
        self._metrics.stop()
        self._engine.stop()
        self._sender.stop()
        for channel in self._channels.close_all():
            _end_channel(channel)
