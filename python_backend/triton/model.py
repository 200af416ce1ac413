"""The Triton Python-backend model class, what Triton's stub loads and calls.

Owns: ``TritonPythonModel`` (decoupled): ``initialize`` loads the model and starts the engine;
``execute`` tells probes, tokenize queries, cancellations and channel openings from generation
requests, reads each generation request's inputs, holds its place in the engine's queue and hands
it to the intake's preparer (``python_backend/intake/``: chat template, tokenizing and media on a
few threads of its own, then the grammar), and returns at once; ``finalize`` stops the preparer
and the engine, then the sender thread (``sender.py``, which turns engine events into responses
and sends every response, the channels' last ones included). Every request ends with exactly one
``COMPLETE_FINAL``: on success, on error and on cancel.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import logging
import signal
import sys
import threading
import time
import uuid
from typing import Any

import triton_python_backend_utils as pb_utils

from python_backend.engine.engine import Engine
from python_backend.engine.liveness import health_problem
from python_backend.engine.request import EngineEvent
from python_backend.intake.intake import Connection, Intake
from python_backend.intake.preparer import Arrival, Query, RequestPreparer, usable_cpus
from python_backend.model.allocator import (
    GlibcHeap,
    HeapKeeper,
    HeapPolicy,
    freeze_startup_objects,
    keep_freed_memory,
)
from python_backend.model.loader import load_model
from python_backend.model.threads import confine_serving_threads, pinned_cpus, serialize_current_thread
from python_backend.parallel.ranks import RankGroup
from python_backend.prompt.inputs import PreparedRequest
from python_backend.prompt.tokenize import answer_query
from python_backend.prompt.vllm_compat import VllmResponder
from python_backend.protocol import contract
from python_backend.protocol.errors import ContractError, ErrorInfo, internal
from python_backend.protocol.settings import EngineSettings
from python_backend.protocol.tokenize import read_query
from python_backend.triton.channels import Channel, ChannelRegistry, Outgoing
from python_backend.triton.metrics import MetricsReporter
from python_backend.triton.orphan import end_with_tritonserver
from python_backend.triton.sender import ResponseLink, ResponseSender

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


_FATAL_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT)


def _die_fast_on_crash() -> None:
    """On a fatal signal, print each thread's Python stack and die at once.

    tvm_ffi (loaded by xgrammar) installs a handler that symbolizes a native backtrace: 6 s on
    the test machine, during which the dying stub still looks alive and every stream waits for
    it. faulthandler chains to the handler it replaces, so the defaults go back first.
    """
    if threading.current_thread() is not threading.main_thread():
        logger.warning("not on the main thread: the fatal-signal handlers stay as they are")
        return
    for number in _FATAL_SIGNALS:
        signal.signal(number, signal.SIG_DFL)
    faulthandler.enable(file=sys.stderr, all_threads=True)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        end_with_tritonserver()  # before anything it could leave behind: ranks, memory
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
            self._start(
                self._ranks.settings if self._ranks is not None else settings, args.get("model_instance_name", "")
            )
        except BaseException:
            if self._ranks is not None:
                self._ranks.close()
            raise

    def _start(self, settings: EngineSettings, instance: str) -> None:
        cpus_here = usable_cpus()  # before the serving threads are pinned to one of them
        loaded = load_model(settings)
        self._tokenizer = loaded.tokenizer
        self._intake = Intake.for_model(loaded, settings)
        formats = self._intake.formats
        logger.info(
            "tool-call format: %s; reasoning format: %s",
            (formats.tool_parser if formats is not None else None) or "none",
            "<think>" if formats is not None and formats.reasoning else "none",
        )
        on_cpu = loaded.device.type == "cpu"
        # Kept under load up to its cap, given back when the engine goes idle (model/allocator.py).
        policy = HeapPolicy.capped_mb(settings.cpu_keep_freed_memory_mb)
        keeps = on_cpu and settings.cpu_keep_freed_memory and keep_freed_memory(policy)
        heap = HeapKeeper(policy.keep_cap, GlibcHeap()) if keeps else None
        cpus = pinned_cpus(settings.torch_threads, on_cpu, settings.cpu_bind_threads)
        if cpus is not None:
            confine_serving_threads(cpus[0])
            logger.info("compute threads pinned to CPUs %s; the stub's other threads share CPU %d", cpus, cpus[0])
        self._channels = ChannelRegistry()
        self._sender = ResponseSender(self._channels)
        sender = self._sender

        def after_pass() -> None:
            sender.pass_ended()
            if heap is not None:
                heap.after_pass()

        ranks = self._ranks.sync if self._ranks is not None else None
        self._engine = Engine(
            loaded,
            settings,
            compute_cpus=cpus,
            after_pass=after_pass,
            ranks=ranks,
            on_idle=heap.release if heap is not None else None,
        )
        self._engine.start()
        self._preparer = RequestPreparer(
            self._intake,
            self._engine,
            float(settings.grammar_compile_timeout_s),
            prepare_timeout_s=float(settings.prepare_timeout_s),
            workers=min(settings.prepare_workers, cpus_here),
        )
        self._preparer.start()
        logger.info("%d preparer threads", self._preparer.workers)
        self._metrics = MetricsReporter(self._engine, loaded.name, pb_utils, instance, self._preparer.stats)
        _die_fast_on_crash()  # last: after every import that may install a handler of its own
        frozen = freeze_startup_objects()  # full collections skip what lives as long as the process
        logger.info("triton-chat model '%s' ready (%d start-up objects frozen)", loaded.name, frozen)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = ResponseLink(request.get_response_sender())
            request_id = request.request_id() or uuid.uuid4().hex
            try:
                if _is_probe(request):
                    self._answer_probe(sender, request_id)
                    continue
                query = _string_input(request, contract.TOKENIZE)
                if query is not None:
                    self._answer_tokenize(sender, request_id, query)
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
                self._accept(request, sender, request_id)
            except ContractError as exc:
                self._fail(sender, request_id, exc.info)
            except Exception:
                logger.exception("request %s could not be read", request_id)
                self._fail(sender, request_id, _INTERNAL)
        return None

    def _accept(self, request: Any, sender: ResponseLink, request_id: str) -> None:
        """Take a generation request: read its inputs now (Triton's call is short), hold its
        waiting place, and leave the rest to the preparer's thread."""
        channel_name = _string_input(request, contract.STREAM_CHANNEL)
        channel = self._channels.find(channel_name) if channel_name is not None else None
        inputs = {tensor.name(): tensor.as_numpy().copy() for tensor in request.inputs()}
        self._engine.reserve()

        def connect(prepared: PreparedRequest) -> Connection:
            return self._connect(sender, channel, prepared)

        def refuse(info: ErrorInfo) -> None:
            self._fail(sender, request_id, info)

        self._preparer.put(Arrival(request_id, inputs, connect, refuse, request.parameters()))

    def _connect(self, sender: ResponseLink, channel: Channel | None, prepared: PreparedRequest) -> Connection:
        """A prepared request's events go to the sender thread; its cancellation is Triton's flag."""
        echo, counts = prepared.echo_prompt, prepared.counts
        # One per request: it counts the tokens each choice has reported (the sender thread only).
        vllm = VllmResponder(prepared.vllm) if prepared.vllm is not None else None

        def sink(event: EngineEvent) -> None:
            self._sender.put(Outgoing(sender, event, echo, counts, channel, vllm))

        asked = [0.0]

        def is_cancelled() -> bool:
            if channel is None:
                return bool(sender.is_cancelled())
            # A closed channel has nowhere to deliver to: its requests stop too. The caller of a
            # channel cancels with ``cancel_request`` (seen at the next step), so Triton's own
            # flag, a round trip each time, is only the fallback, asked less often.
            now = time.monotonic()
            if channel.closed or now - asked[0] < CHANNEL_REQUEST_POLL_S:
                return channel.closed
            asked[0] = now
            return bool(sender.is_cancelled())

        return Connection(sink, is_cancelled)

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

    def _answer_tokenize(self, sender: ResponseLink, request_id: str, text: str) -> None:
        """No generation: the tokenizer's answer, outside the batch, on a preparer thread under the
        preparation deadline (a multi-megabyte text takes seconds, which the stub's thread must
        never spend, and a preparer thread only so long)."""

        def answer(query: Query) -> str:
            read = read_query(text)
            query.prompt_field = read.param
            limits = self._engine.limits
            return answer_query(
                read, self._tokenizer, max_model_len=limits.max_seq_len, vocab_size=len(self._tokenizer)
            )

        def respond(reply: str) -> None:
            delta = contract.ChoiceDelta(index=0, text=reply)
            self._sender.put(Outgoing(sender, EngineEvent(request_id, delta=delta, final=True)))

        self._preparer.put(Query(request_id, answer, respond, lambda info: self._fail(sender, request_id, info)))

    def _cancel(self, target: str) -> None:
        """``cancel_request``: a request id, or an open channel's name (its caller is done with it)."""
        channel = self._channels.get(target)
        if channel is not None:
            logger.info("response channel %s closed by its caller", target)
            self._sender.close_later(channel)
        else:
            self._engine.cancel(target, before_arrival=True)
            self._preparer.cancel(target)  # still being prepared: renewed when it joins the engine

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
        self._preparer.stop()  # what it still holds is refused; what it handed on, the engine ends
        self._engine.stop()
        self._intake.close()
        if self._ranks is not None:
            self._ranks.close()
        self._sender.stop()  # ends the open channels too, on its own thread
        # What start-up froze stays frozen: the process ends after this. Unfrozen, the next
        # collection walked the stub's own start-up objects while the stub tore them down, and
        # the stub died with SIGSEGV after most unloads.
