"""The Triton Python-backend model class, what Triton's stub loads and calls.

Owns: ``TritonPythonModel`` (decoupled): ``initialize`` loads the model and starts the engine;
``execute`` tells probes, cancellations and channel openings from generation requests, decodes
and submits each and returns at once; ``finalize`` stops the engine, then the sender thread
(``sender.py``, which turns engine events into responses). Every request ends with exactly one
``COMPLETE_FINAL``: on success, on error and on cancel.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from typing import Any

import triton_python_backend_utils as pb_utils

from python_backend.engine.engine import Engine
from python_backend.engine.liveness import health_problem
from python_backend.engine.sequence import EngineEvent, EngineRequest
from python_backend.model.loader import load_model
from python_backend.model.threads import confine_serving_threads, pinned_cpus, serialize_current_thread
from python_backend.parallel.ranks import RankGroup
from python_backend.prompt.inputs import decode_request
from python_backend.protocol import contract
from python_backend.protocol.errors import ContractError, ErrorInfo, internal
from python_backend.protocol.settings import EngineSettings
from python_backend.sampling.structured import GrammarCompiler
from python_backend.text.output_formats import resolve_formats
from python_backend.triton.channels import ChannelRegistry, Outgoing
from python_backend.triton.metrics import MetricsReporter
from python_backend.triton.sender import ResponseLink, ResponseSender, end_channel

logger = logging.getLogger("triton_chat")

_INTERNAL = internal("internal error while reading the request")
# How often a channel-bound request's Triton cancellation flag is asked (see _submit).
CHANNEL_REQUEST_POLL_S = 0.5


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
        # Tensor parallel: the other ranks' processes start and join here, then load with rank 0.
        self._ranks = RankGroup.start(settings) if settings.tensor_parallel_size > 1 else None
        try:
            self._start(self._ranks.settings if self._ranks is not None else settings)
        except BaseException:
            if self._ranks is not None:
                self._ranks.close()
            raise

    def _start(self, settings: EngineSettings) -> None:
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
        self._sender = ResponseSender(self._channels)
        ranks = self._ranks.sync if self._ranks is not None else None
        self._engine = Engine(loaded, settings, compute_cpus=cpus, after_pass=self._sender.pass_ended, ranks=ranks)
        self._engine.start()
        self._metrics = MetricsReporter(self._engine, loaded.name, pb_utils)
        logger.info("triton-chat model '%s' ready", loaded.name)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = ResponseLink(request.get_response_sender())
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

    def _submit(self, request: Any, sender: ResponseLink, request_id: str) -> None:
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

    def _answer_probe(self, sender: ResponseLink, request_id: str) -> None:
        # Through the sender thread like any response, so a stuck sender fails the probe too.
        health = self._engine.health()
        # A dead rank first: the engine fails too at its next collective, but says less.
        problem = (self._ranks.problem() if self._ranks is not None else None) or health_problem(health)
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

    def _open_channel(self, sender: ResponseLink, request_id: str, name: str) -> None:
        self._channels.open(name, sender)
        logger.info("response channel %s open", name)
        # The first response says the channel is open: its text is the channel's name.
        delta = contract.ChoiceDelta(index=0, text=name)
        self._sender.put(Outgoing(sender, EngineEvent(request_id, delta=delta)))

    def _fail(self, sender: ResponseLink, request_id: str, info: ErrorInfo) -> None:
        self._sender.put(Outgoing(sender, EngineEvent(request_id, error=info, final=True)))

    def finalize(self) -> None:
        self._metrics.stop()
        self._engine.stop()
        if self._ranks is not None:
            self._ranks.close()
        self._sender.stop()
        for channel in self._channels.close_all():
            end_channel(channel)
