"""Preparing requests beside the caller's thread and the engine's step loop.

Owns ``RequestPreparer``: a coordinating thread and a small pool of preparer threads that run each
arrived request through the intake (``intake.py``). A preparer thread runs the request's
parameters, chat template, tokenizing and media decoding (``Intake.prepare``); the coordinator
then, for a ``response_format``, waits for its grammar (compiled on the grammar compiler's own
thread, ``sampling/structured.py``), builds the request with the arrival's ``Connection`` and
hands it to the engine. Each stage has a deadline, and
none holds up the requests behind it:

* preparing: ``prepare_timeout_s`` from arrival; past it the request gets a 400 naming its prompt
  (or a 429 if it never got a preparer thread), and what its thread still computes is dropped
  when it finishes (``PreparerStats`` counts both);
* compiling: ``grammar_compile_timeout_s``; past it, a 400 naming ``response_format``.

``Arrival`` is what a transport hands over: the request's inputs, read while its call lasts, how to
connect the prepared request to the transport and how to refuse it, and a waiting place the engine
already holds for it (so 429s stay exact); every way out of here (joined, refused, timed out,
stopped) settles the place exactly once, on the coordinator's thread.
A ``Query`` (a tokenize request) is answered beside the engine, holding no place: its answer is
computed on a preparer thread under the same deadline, and sent or refused exactly once.

Why threads of their own: Triton's ``execute`` runs on the stub's only thread, which also reads every new
request, cancellation and health probe; a request that takes seconds to prepare there would
delay all of them, and a probe unanswered long enough restarts the server. Why several: one
multi-megabyte prompt would otherwise delay every short request that arrives after it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from python_backend.engine import admission
from python_backend.engine.request import EngineRequest
from python_backend.intake.intake import Connection, Intake
from python_backend.prompt.inputs import PreparedRequest
from python_backend.protocol import contract
from python_backend.protocol.errors import (
    ContractError,
    ErrorInfo,
    internal,
    invalid,
    prepare_timed_out,
    preparers_busy,
    shutting_down,
)
from python_backend.sampling.structured import FIELD

logger = logging.getLogger("triton_chat")

_INTERNAL = internal("internal error while reading the request")
_STOP_WAIT_S = 5.0  # beyond the preparation deadline, for the coordinator to answer what is left
_PREPARING = "preparing"
_COMPILING = "compiling"


class Admits(Protocol):
    """What the preparer needs of the engine."""

    def submit(self, request: EngineRequest, reserved: bool = False) -> None: ...

    def unreserve(self) -> None: ...

    def cancel(self, request_id: str, before_arrival: bool = False) -> None: ...


@dataclass
class Arrival:
    """A generation request as its transport took it, with a waiting place held in the engine."""

    request_id: str
    inputs: dict[str, np.ndarray]
    connect: Callable[[PreparedRequest], Connection]  # the transport's side, once it is prepared
    refuse: Callable[[ErrorInfo], None]  # answer it with an error (it never reached the engine)
    parameters: str = ""  # the transport's request parameters, as JSON (the vLLM contract reads them)

    @property
    def prompt_field(self) -> str:
        """The input that carries its prompt, for errors about the prompt as a whole."""
        return contract.TEXT_INPUT if contract.TEXT_INPUT in self.inputs else contract.MESSAGES


@dataclass
class Query:
    """A request answered beside the engine (a tokenize query), prepared like an ``Arrival``."""

    request_id: str
    # On a preparer thread: the answer's text, or ContractError for a bad query; it may name the
    # query's ``prompt_field`` once it has read which kind the query is.
    answer: Callable[[Query], str]
    respond: Callable[[str], None]  # on the coordinator's thread, at most once
    refuse: Callable[[ErrorInfo], None]  # the same
    prompt_field: str = contract.TOKENIZE  # what a refusal at the deadline names


@dataclass(frozen=True)
class PreparerStats:
    """Counts since start, for the metrics thread (plain ints: read without a lock)."""

    prepare_timeouts: int  # requests refused at their preparation deadline
    late_preparations: int  # preparations that finished after that, whose result was dropped


@dataclass(eq=False)
class _Waiting:
    """A request between its arrival and the engine; ``stage`` says what it waits for."""

    arrival: Arrival | Query
    stage: str = _PREPARING
    prepared: PreparedRequest | None = None
    started: bool = False  # a preparer thread took it up (set on that thread)
    settled: bool = False  # answered: joined the engine, or refused
    cancelled_at: float | None = None  # when its caller cancelled it (the engine ends it on arrival)


@dataclass(frozen=True)
class _Cancel:
    request_id: str


@dataclass
class _Done:
    """A stage's work finished, on a preparer thread (``_PREPARING``) or the grammar compiler's."""

    waiting: _Waiting
    stage: str
    result: Any = None
    error: BaseException | None = None


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


@dataclass
class RequestPreparer:
    intake: Intake
    engine: Admits
    timeout_s: float  # grammar_compile_timeout_s
    prepare_timeout_s: float = 30.0
    workers: int = 1  # preparer threads
    _queue: queue.SimpleQueue[Arrival | Query | _Done | _Cancel | None] = field(default_factory=queue.SimpleQueue)
    # The coordinator's own (its thread only): deadlines of the requests in a stage, and the
    # requests not yet settled by id.
    _deadlines: list[tuple[float, int, str, _Waiting]] = field(default_factory=list)
    _held: dict[str, _Waiting] = field(default_factory=dict)
    _order: itertools.count[int] = field(default_factory=itertools.count)
    _work: queue.SimpleQueue[_Waiting | None] = field(default_factory=queue.SimpleQueue)
    _thread: threading.Thread | None = None
    _timeouts: int = 0
    _late: int = 0

    def start(self) -> None:
        self.workers = max(1, self.workers)
        # Daemon threads, not an executor's: a preparation that outlived its deadline must not
        # hold up the process's exit.
        for number in range(self.workers):
            name = f"triton-chat-prepare-{number}"
            threading.Thread(target=self._work_loop, name=name, daemon=True).start()
        self._thread = threading.Thread(target=self._run, name="triton-chat-prepare", daemon=True)
        self._thread.start()

    def put(self, arrival: Arrival | Query) -> None:
        self._queue.put(arrival)

    def cancel(self, request_id: str) -> None:
        """A ``cancel_request`` for a request that may still be here: the engine's record of an
        early cancel is renewed when the request joins it if it may have expired meanwhile."""
        self._queue.put(_Cancel(request_id))

    def stats(self) -> PreparerStats:
        return PreparerStats(self._timeouts, self._late)

    def stop(self) -> None:
        """Prepare what arrived (each until its deadline), refuse what still waits for a grammar,
        and end the threads; a preparation past its deadline finishes on its own and is dropped."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(self.prepare_timeout_s + _STOP_WAIT_S)
        for _ in range(self.workers):
            self._work.put(None)  # each preparer thread ends after what it is doing

    # --- the coordinator's thread ---------------------------------------------------------------
    def _run(self) -> None:
        stopping = False
        while not (stopping and not self._preparing()):
            try:
                item = self._queue.get(timeout=self._until_next_deadline())
            except queue.Empty:  # nothing came before the next deadline
                self._expire(time.monotonic())
                continue
            if item is None:
                stopping = True  # what arrived is still prepared, until its deadline
                continue
            if isinstance(item, Arrival | Query):
                self._start_preparing(item)
            elif isinstance(item, _Cancel):
                held = self._held.get(item.request_id)
                if held is not None:
                    held.cancelled_at = time.monotonic()
            elif item.stage == _PREPARING:
                self._prepared(item)
            else:
                self._compiled(item)
            self._expire(time.monotonic())
        stopped = shutting_down()
        for _, _, _, waiting in self._deadlines:
            self._settle(waiting, stopped)

    def _preparing(self) -> bool:
        return any(waiting.stage == _PREPARING for waiting in self._held.values())

    def _until_next_deadline(self) -> float | None:
        if not self._deadlines:
            return None
        return max(self._deadlines[0][0] - time.monotonic(), 0.0)

    def _wait_for(self, waiting: _Waiting, stage: str, timeout_s: float) -> None:
        waiting.stage = stage
        heapq.heappush(self._deadlines, (time.monotonic() + timeout_s, next(self._order), stage, waiting))

    def _start_preparing(self, arrival: Arrival | Query) -> None:
        waiting = _Waiting(arrival)
        self._held[arrival.request_id] = waiting
        self._wait_for(waiting, _PREPARING, self.prepare_timeout_s)
        self._work.put(waiting)

    def _prepared(self, item: _Done) -> None:
        waiting, error = item.waiting, item.error
        if waiting.settled:
            self._late += 1
            logger.info("request %s: its preparation finished after its deadline; dropped", _id(waiting))
            return
        if isinstance(error, ContractError):
            self._settle(waiting, error.info)
            return
        if error is not None:
            logger.error("request %s could not be read", _id(waiting), exc_info=error)
            self._settle(waiting, _INTERNAL)
            return
        arrival = waiting.arrival
        if isinstance(arrival, Query):
            waiting.settled = True
            self._release(waiting)
            arrival.respond(item.result)
            return
        prepared: PreparedRequest = item.result
        waiting.prepared = prepared
        try:
            response_format = prepared.params.response_format
            if response_format is None:
                self._join(waiting, arrival, prepared, None)
                return
            grammars = self.intake.grammars
            spec = grammars.spec(response_format)
            compiled = grammars.cached(spec)
            if compiled is not None:
                self._join(waiting, arrival, prepared, compiled)
                return
            self._wait_for(waiting, _COMPILING, self.timeout_s)
            grammars.compile_async(spec).add_done_callback(lambda done: self._compile_done(waiting, done))
        except ContractError as exc:
            self._settle(waiting, exc.info)
        except Exception:
            logger.exception("request %s could not be read", _id(waiting))
            self._settle(waiting, _INTERNAL)

    def _compiled(self, item: _Done) -> None:
        waiting = item.waiting
        if waiting.settled:
            return  # refused at its deadline; the grammar is cached for the next request
        error = item.error
        if isinstance(error, ContractError):
            self._settle(waiting, error.info)
        elif error is not None:
            self._settle(waiting, _INTERNAL)
        elif waiting.prepared is not None and isinstance(waiting.arrival, Arrival):
            self._join(waiting, waiting.arrival, waiting.prepared, item.result)

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, stage, waiting = heapq.heappop(self._deadlines)
            if waiting.settled or waiting.stage != stage:
                continue  # answered, or in a later stage with a deadline of its own
            if stage == _COMPILING:
                logger.warning("request %s: its response_format did not compile in time", _id(waiting))
                info = invalid(
                    f"'response_format' did not compile into a grammar within {self.timeout_s:g} s "
                    "(grammar_compile_timeout_s); simplify the schema",
                    FIELD,
                ).info
            elif waiting.started:
                self._timeouts += 1
                logger.warning(
                    "request %s: preparing its prompt took longer than %g s (prepare_timeout_s); refused",
                    _id(waiting),
                    self.prepare_timeout_s,
                )
                info = prepare_timed_out(self.prepare_timeout_s, waiting.arrival.prompt_field)
            else:
                self._timeouts += 1
                logger.warning("request %s: no preparer thread was free in time; refused", _id(waiting))
                info = preparers_busy(self.prepare_timeout_s, self.workers)
            self._settle(waiting, info)

    def _join(self, waiting: _Waiting, arrival: Arrival, prepared: PreparedRequest, grammar: Any) -> None:
        """Hand the request to the engine, in the place held for it."""
        waiting.settled = True
        self._release(waiting)
        try:
            request = self.intake.request(arrival.request_id, prepared, grammar, arrival.connect(prepared))
        except Exception:
            logger.exception("request %s could not be built", arrival.request_id)
            self._refuse(arrival, _INTERNAL)
            return
        asked = waiting.cancelled_at
        if asked is not None and time.monotonic() - asked >= admission.EARLY_CANCEL_S / 2:
            # The engine remembers an early cancel only so long: told again, it ends the request.
            self.engine.cancel(arrival.request_id, before_arrival=True)
        try:
            self.engine.submit(request, reserved=True)  # a refusal gives the place back
        except ContractError as exc:
            arrival.refuse(exc.info)
        except Exception:
            logger.exception("request %s could not be submitted", arrival.request_id)
            arrival.refuse(_INTERNAL)

    def _settle(self, waiting: _Waiting, info: ErrorInfo) -> None:
        """Refuse a request not yet answered (it never reached the engine)."""
        if not waiting.settled:
            waiting.settled = True
            self._release(waiting)
            self._refuse(waiting.arrival, info)

    def _release(self, waiting: _Waiting) -> None:
        if self._held.get(waiting.arrival.request_id) is waiting:  # ids may repeat
            del self._held[waiting.arrival.request_id]

    def _refuse(self, arrival: Arrival | Query, info: ErrorInfo) -> None:
        """Answer a request that never reached the engine, and give its place back (a query holds none)."""
        if isinstance(arrival, Query):
            arrival.refuse(info)
            return
        self.engine.unreserve()
        arrival.refuse(info)

    # --- other threads --------------------------------------------------------------------------
    def _compile_done(self, waiting: _Waiting, future: Future[Any]) -> None:
        error = future.exception()
        result = None if error is not None else future.result()
        self._queue.put(_Done(waiting, _COMPILING, result, error))

    def _work_loop(self) -> None:
        """A preparer thread: prepare each request it is given, and tell the coordinator."""
        while True:
            waiting = self._work.get()
            if waiting is None:
                return
            if waiting.settled:
                continue  # refused while it waited for a thread: nothing to compute
            waiting.started = True
            arrival = waiting.arrival
            try:
                if isinstance(arrival, Query):
                    result: Any = arrival.answer(arrival)
                else:
                    result = self.intake.prepare(arrival.inputs.get, arrival.parameters)
                done = _Done(waiting, _PREPARING, result=result)
            except Exception as exc:  # the coordinator answers it (a ContractError is a 400)
                done = _Done(waiting, _PREPARING, error=exc)
            self._queue.put(done)


def _id(waiting: _Waiting) -> str:
    return waiting.arrival.request_id
