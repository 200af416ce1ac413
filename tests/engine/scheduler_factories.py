"""Synthetic requests for driving the scheduler without a model or torch."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from python_backend.engine.admission import Admission
from python_backend.engine.request import EngineEvent, EngineRequest, RequestGroup
from python_backend.engine.scheduler import HitLookup, Sampled, Scheduler, StepPlan
from python_backend.protocol.params import parse_parameters


@dataclass
class Books:
    """A scheduler and the requests submitted to it, by id."""

    scheduler: Scheduler
    groups: dict[str, RequestGroup] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def submit(self, prompt_tokens: int, reservation: int = 1, media: bool = False, **params: Any) -> RequestGroup:
        """A request whose prompt has ``prompt_tokens`` tokens arrives (submitted and taken in, as
        at the start of an engine step); ``params`` as a client sends them."""
        request = EngineRequest(
            request_id=f"r{next(self.ids)}",
            prompt_ids=list(range(1, prompt_tokens + 1)),
            params=parse_parameters(params),
            sink=_no_sink,
            media=object() if media else None,  # type: ignore[arg-type]  # only its presence matters here
        )
        group = RequestGroup(request, max_new_tokens=8, reservation=reservation)
        self.scheduler.admission.enqueue(group)
        self.scheduler.take_in()
        self.groups[request.request_id] = group
        return group

    def step(self, lookup: HitLookup | None = None, ended: tuple[str, ...] = ()) -> StepPlan:
        """One engine step as the scheduler sees it: its plan, then the passes' report, in which
        the rows of ``ended`` (request ids) finished their sequence."""
        plan = self.scheduler.schedule(lookup or no_hits)
        self.scheduler.update(plan, [Sampled(request_id, True) for request_id in ended])
        return plan


def make_books(
    max_num_seqs: int = 8, max_num_batched_tokens: int = 64, kv_budget_tokens: int = 1000, max_waiting: int = 100
) -> Books:
    admission = Admission(max_waiting, kv_budget_tokens)
    return Books(Scheduler(admission, max_num_seqs, max_num_batched_tokens))


def no_hits(_group: RequestGroup) -> int | None:
    return None


def _no_sink(_event: EngineEvent) -> None:
    raise AssertionError("the scheduler never sends events")


def ids(groups: list[RequestGroup]) -> list[str]:
    return [g.request.request_id for g in groups]
