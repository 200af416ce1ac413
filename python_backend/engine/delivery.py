"""Delivery: turning the scheduler's outcomes of a pass into each request's events.

Owns ``deliver`` (one event to one request's sink, a broken sink logged and contained) and
``Delivery``, which after a pass reports each row's result to the scheduler
(``Scheduler.update``: it decides which requests end) and sends what is due: a streamed delta
every ``stream_interval`` tokens, the whole answer of a buffered request (``best_of``: the best
``n`` by cumulative logprob), beam search's answers, and the final event of a request that ended.
Dropping finished rows from the batch is the engine's. The engine thread alone calls it.
"""

from __future__ import annotations

import logging
from typing import Any

from python_backend.engine.beam_steps import beam_answers
from python_backend.engine.execution import Execution, Executions
from python_backend.engine.request import EngineEvent, EngineRequest
from python_backend.engine.scheduler import Sampled, Scheduler, StepPlan
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

    def send(self, plan: StepPlan, sequences: list[Sequence]) -> None:
        """Send what these sequences' newest tokens made ready (``plan``: the step's)."""
        sampled = [Sampled(seq.request.request_id, seq.finish_reason is not None) for seq in sequences]
        for seq, outcome in zip(sequences, self._scheduler.update(plan, sampled), strict=True):
            if outcome is None:
                continue  # its request has left
            group, done = outcome.group, outcome.final
            run = self._runs.of(group)
            if run.beam is not None:
                if done:
                    for event in beam_answers(run, self._tokenizer):
                        deliver(group.request, event)
                    self._runs.forget(group)
                continue
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
                self._runs.forget(group)

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
        self._runs.forget(group.group)
