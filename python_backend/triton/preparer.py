"""Preparing generation requests beside the stub's thread and the engine's step loop.

Owns ``RequestPreparer``: one thread that turns each arrived request's inputs into an
``EngineRequest`` (parameters, chat template, tokenizing) and, for a ``response_format``, waits
for its grammar (compiled on the grammar compiler's own thread, ``sampling/structured.py``)
without holding up the requests behind it: a request joins the engine when its grammar is ready,
or gets a 400 naming ``response_format`` when it is not ready within the compile timeout.
``Arrival`` is what ``execute`` hands over: the request's inputs, read while Triton's call lasts,
and a waiting place the engine already holds for it (so 429s stay exact).

Why a thread of its own: ``execute`` runs on the stub's only thread, which also reads every new
request, cancellation and health probe; a request that takes seconds to prepare there would
delay all of them, and a probe unanswered long enough restarts the server.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from python_backend.engine.request import EngineRequest
from python_backend.prompt.inputs import PreparedRequest
from python_backend.protocol.errors import ContractError, ErrorInfo, internal, invalid, shutting_down
from python_backend.sampling.structured import FIELD, GrammarCompiler
from python_backend.triton.channels import Channel

logger = logging.getLogger("triton_chat")

_INTERNAL = internal("internal error while reading the request")
_STOP_WAIT_S = 30.0


class Admits(Protocol):
    """What the preparer needs of the engine."""

    def submit(self, request: EngineRequest, reserved: bool = False) -> None: ...

    def unreserve(self) -> None: ...


@dataclass
class Arrival:
    """A generation request as ``execute`` took it, with a waiting place held in the engine."""

    request_id: str
    sender: Any  # the request's ResponseLink
    inputs: dict[str, np.ndarray]
    channel: Channel | None = None
    parameters: str = ""  # the Triton request parameters, as JSON (the vLLM contract reads them)

    def get(self, name: str) -> np.ndarray | None:
        return self.inputs.get(name)


@dataclass(eq=False)
class _Waiting:
    """A prepared request whose grammar is compiling."""

    arrival: Arrival
    prepared: PreparedRequest
    deadline: float
    settled: bool = False  # answered: joined the engine, or refused


@dataclass
class _Compiled:
    waiting: _Waiting
    future: Future[Any]


# Builds the EngineRequest (its sink and cancellation check) for a prepared arrival and grammar.
MakeRequest = Callable[[Arrival, PreparedRequest, Any], EngineRequest]
Decode = Callable[[Arrival], PreparedRequest]
Fail = Callable[[Arrival, ErrorInfo], None]


@dataclass
class RequestPreparer:
    decode: Decode
    grammars: GrammarCompiler
    engine: Admits
    make_request: MakeRequest
    fail: Fail
    timeout_s: float
    _queue: queue.SimpleQueue[Arrival | _Compiled | None] = field(default_factory=queue.SimpleQueue)
    _deadlines: list[tuple[float, int, _Waiting]] = field(default_factory=list)  # this thread only
    _order: itertools.count[int] = field(default_factory=itertools.count)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="triton-chat-prepare", daemon=True)
        self._thread.start()

    def put(self, arrival: Arrival) -> None:
        self._queue.put(arrival)

    def stop(self) -> None:
        """Prepare what arrived, refuse what still waits for a grammar, and end the thread."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(_STOP_WAIT_S)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._until_next_deadline())
            except queue.Empty:  # nothing came before the next deadline
                self._expire(time.monotonic())
                continue
            if item is None:
                break
            if isinstance(item, Arrival):
                self._prepare(item)
            elif isinstance(item, _Compiled):
                self._compiled(item)
            self._expire(time.monotonic())
        stopped = shutting_down()
        for _, _, waiting in self._deadlines:
            if not waiting.settled:
                waiting.settled = True
                self._refuse(waiting.arrival, stopped)

    def _until_next_deadline(self) -> float | None:
        if not self._deadlines:
            return None
        return max(self._deadlines[0][0] - time.monotonic(), 0.0)

    def _prepare(self, arrival: Arrival) -> None:
        try:
            prepared = self.decode(arrival)
            response_format = prepared.params.response_format
            if response_format is None:
                self._join(arrival, prepared, None)
                return
            spec = self.grammars.spec(response_format)
            compiled = self.grammars.cached(spec)
            if compiled is not None:
                self._join(arrival, prepared, compiled)
                return
            waiting = _Waiting(arrival, prepared, time.monotonic() + self.timeout_s)
            heapq.heappush(self._deadlines, (waiting.deadline, next(self._order), waiting))
            future = self.grammars.compile_async(spec)
            future.add_done_callback(lambda done: self._queue.put(_Compiled(waiting, done)))
        except ContractError as exc:
            self._refuse(arrival, exc.info)
        except Exception:
            logger.exception("request %s could not be read", arrival.request_id)
            self._refuse(arrival, _INTERNAL)

    def _compiled(self, item: _Compiled) -> None:
        waiting = item.waiting
        if waiting.settled:
            return  # refused at its deadline; the grammar is cached for the next request
        waiting.settled = True
        error = item.future.exception()
        if isinstance(error, ContractError):
            self._refuse(waiting.arrival, error.info)
        elif error is not None:
            self._refuse(waiting.arrival, _INTERNAL)
        else:
            self._join(waiting.arrival, waiting.prepared, item.future.result())

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, waiting = heapq.heappop(self._deadlines)
            if waiting.settled:
                continue
            waiting.settled = True
            logger.warning("request %s: its response_format did not compile in time", waiting.arrival.request_id)
            info = invalid(
                f"'response_format' did not compile into a grammar within {self.timeout_s:g} s "
                "(grammar_compile_timeout_s); simplify the schema",
                FIELD,
            ).info
            self._refuse(waiting.arrival, info)

    def _join(self, arrival: Arrival, prepared: PreparedRequest, grammar: Any) -> None:
        """Hand the request to the engine, in the place held for it."""
        try:
            request = self.make_request(arrival, prepared, grammar)
        except Exception:
            logger.exception("request %s could not be built", arrival.request_id)
            self._refuse(arrival, _INTERNAL)
            return
        try:
            self.engine.submit(request, reserved=True)  # a refusal gives the place back
        except ContractError as exc:
            self.fail(arrival, exc.info)
        except Exception:
            logger.exception("request %s could not be submitted", arrival.request_id)
            self.fail(arrival, _INTERNAL)

    def _refuse(self, arrival: Arrival, info: ErrorInfo) -> None:
        """Answer a request that never reached the engine, and give its place back."""
        self.engine.unreserve()
        self.fail(arrival, info)
