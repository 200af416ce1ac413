"""Delivery: turning sequences' new tokens into each request's events.

Owns ``deliver`` (one event to one request's sink, a broken sink logged and contained) and
``Delivery``, which after a step decides, per request, what is due: a streamed delta every
``stream_interval`` tokens, the whole answer of a buffered request (``best_of``: the best ``n``
by cumulative logprob), beam search's answers, and the final event; a request whose every choice
ended leaves the scheduler's books (``Scheduler.finish``). Dropping finished rows from the batch
is the engine's. The engine thread alone calls it.
"""

from __future__ import annotations

import logging
from typing import Any

from python_backend.engine.beam_steps import beam_answers
from python_backend.engine.execution import Execution, Executions
from python_backend.engine.request import EngineEvent, EngineRequest
from python_backend.engine.scheduler import Scheduler
from python_backend.engine.sequence import Sequence

logger = logging.getLogger(__name__)


def deliver(request: EngineRequest, event: EngineEvent) -> None:
    try:
        request.sink(event)
    except Exception:  # one request's broken sink must not stop the batch
        logger.exception("sink failed for %s", request.request_id)


class Delivery:
    def __init__(self, scheduler: Scheduler, runs: Executions, tokenizer: Any, stream_interval: int) -> None:
        self._scheduler = scheduler
        self._runs = runs
        self._tokenizer = tokenizer
        self._stream_interval = stream_interval

    def send(self, sequences: list[Sequence]) -> None:
        """Send what these sequences' newest tokens made ready."""
        for seq in sequences:
            group = self._scheduler.group(seq.request.request_id)
            if group is None:
                continue
            run = self._runs.of(group)
            if run.beam is not None:
                if seq.finish_reason is not None and self._scheduler.group(group.request.request_id) is group:
                    for event in beam_answers(run, self._tokenizer):
                        deliver(group.request, event)
                    self._finish(run)
                continue
            if seq.finish_reason is not None:
                group.finished += 1
            done = group.finished == len(run.sequences)
            if group.buffered:
                if done:
                    self._send_best(run)
                continue
            if not (done or seq.delta_due(group.request.stream, self._stream_interval)):
                continue
            delta = seq.take_delta(len(group.request.prompt_ids))
            run.attach_prompt_logprobs(delta)
            if delta is not None or done:
                deliver(group.request, EngineEvent(group.request.request_id, delta=delta, final=done))
            if done:
                self._finish(run)

    def _finish(self, run: Execution) -> None:
        self._scheduler.finish(run.group)
        self._runs.forget(run.group)

    def _send_best(self, group: Execution) -> None:
        ranked = sorted(group.sequences, key=lambda s: s.cumulative_logprob, reverse=True)
        chosen = ranked[: group.request.params.n]
        for index, seq in enumerate(chosen):
            seq.index = index
            delta = seq.take_delta(len(group.request.prompt_ids))
            if delta is not None and not group.request.params.logprobs:
                delta.logprobs = None
            group.attach_prompt_logprobs(delta)
            final = index == len(chosen) - 1
            deliver(group.request, EngineEvent(group.request.request_id, delta=delta, final=final))
        self._finish(group)
