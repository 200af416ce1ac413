"""The scheduler: what each engine step does, decided without torch, and what its results mean.

Owns the requests inside the engine (``RequestGroup`` by id), which of them run (their rows are
in the batch), the one prompt being prefilled in chunks, and each step's decisions, as vLLM's
scheduler does (``schedule`` -> the engine executes -> ``update``). ``schedule`` returns a
``StepPlan``:

* which cancelled requests are reaped (``reap``), waiting or admitted;
* which waiting requests are admitted: FIFO (the head waits for room rather than being
  overtaken), within the sequence rows (``max_num_seqs``) and the KV reservation budget;
* what each admitted prompt prefills within the step's token budget
  (``max_num_batched_tokens``): a long prompt in chunks over several steps, short ones together
  in one pass, a media prompt alone and whole;
* which prompts join the running batch straight from a prefix-cache hit that covers all but
  their last token (the next decode step feeds it).

Results come back through ``update(plan, sampled)``: the plan's completed prompts now run, and
each reported row's sequence either goes on or ended; a request ends when its every choice has
(beam search: when its search has), and leaves the books with its reservation (``finish``).
``discard`` takes out a request that failed or stopped. Prefix-cache hits arrive as token counts
from a lookup callable, so nothing here touches tensors; the bounded queue and cancellations are
``admission.py``'s. The engine thread alone calls it, except where ``Admission`` says otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from python_backend.engine.admission import Admission
from python_backend.engine.request import RequestGroup

# Prompt tokens the prefix cache holds for a waiting request, or None without a hit.
HitLookup = Callable[[RequestGroup], int | None]


@dataclass
class PrefillChunk:
    """Prompt positions ``start:end`` of a long prompt, computed in this step."""

    group: RequestGroup
    start: int
    end: int
    cached: int = 0  # prompt tokens taken from the prefix cache before this (its first) chunk

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def last(self) -> bool:
        """The prompt is complete after this chunk: the request then joins the running batch."""
        return self.end == len(self.group.request.prompt_ids)


@dataclass
class Admitted:
    """A prompt admitted whole in this step, ``cached`` of its tokens from the prefix cache."""

    group: RequestGroup
    cached: int = 0


@dataclass
class StepPlan:
    """One step's prefill, executed in this order: the running chunked prompt's next chunk,
    the cache joins, then one of a batch of short prompts, a media prompt, or a new chunked one."""

    resumed: PrefillChunk | None = None
    joins: list[Admitted] = field(default_factory=list)
    batch: list[Admitted] = field(default_factory=list)
    media: RequestGroup | None = None
    started: PrefillChunk | None = None
    tokens: int = 0  # prompt tokens of the budget this plan uses

    @property
    def admitted(self) -> list[RequestGroup]:
        """Requests admitted in this step, in admission order."""
        groups = [a.group for a in self.joins] + [a.group for a in self.batch]
        if self.media is not None:
            groups.append(self.media)
        if self.started is not None:
            groups.append(self.started.group)
        return groups

    @property
    def empty(self) -> bool:
        return self.resumed is None and not self.admitted

    @property
    def completed(self) -> list[RequestGroup]:
        """Requests whose prompt is whole after this step: they run from now on."""
        groups = [a.group for a in self.joins] + [a.group for a in self.batch]
        if self.media is not None:
            groups.append(self.media)
        groups += [c.group for c in (self.resumed, self.started) if c is not None and c.last]
        return groups


@dataclass(frozen=True)
class Sampled:
    """One row's result of a pass, as the engine reports it: its request, and whether its
    sequence ended there (a stop rule, a length, the end of a beam search)."""

    request_id: str
    ended: bool


@dataclass(frozen=True)
class Outcome:
    """What a reported row means: its request, and whether the request ends with it (then it has
    left the books: its last event goes out now)."""

    group: RequestGroup
    final: bool


class Scheduler:
    def __init__(self, admission: Admission, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.admission = admission
        self._max_rows = max_num_seqs
        self._token_budget = max_num_batched_tokens
        self._groups: dict[str, RequestGroup] = {}
        self._running: dict[str, RequestGroup] = {}  # their rows are in the batch
        self._prefilling: RequestGroup | None = None

    # --- what the engine asks -------------------------------------------------------------------
    def group(self, request_id: str) -> RequestGroup | None:
        return self._groups.get(request_id)

    @property
    def groups(self) -> list[RequestGroup]:
        """Every request that arrived and has not ended, waiting or admitted."""
        return list(self._groups.values())

    @property
    def running_rows(self) -> int:
        """Rows the running requests hold: each choice's until it ends, a beam search's all through."""
        return sum(group.candidates - group.finished for group in self._running.values())

    @property
    def busy(self) -> bool:
        return bool(self._groups) or self.admission.queued > 0

    @property
    def has_prefill_work(self) -> bool:
        """A prompt waits or is half prefilled (decode work is the engine's to know)."""
        return bool(self.admission.waiting) or self._prefilling is not None

    # --- each step ------------------------------------------------------------------------------
    def take_in(self) -> None:
        """Move newly submitted requests onto the books and the waiting queue."""
        for group in self.admission.drain():
            request_id = group.request.request_id
            self._groups[request_id] = group
            if self.admission.cancelled_before_arrival(request_id):
                self.admission.request_cancel(request_id)

    def reap(self) -> list[RequestGroup]:
        """Take in new requests; return the cancelled ones, already off the books (their rows,
        if any, are the engine's to drop)."""
        self.take_in()
        reaped = []
        for request_id in self.admission.take_cancelled():
            group = self._groups.get(request_id)
            if group is not None and self.discard(group):
                reaped.append(group)
        return reaped

    def schedule(self, lookup: HitLookup) -> StepPlan:
        """Decide this step's prefill, beside the rows the running requests hold."""
        running_rows = self.running_rows
        plan = StepPlan()
        budget = self._token_budget
        pending_rows = 0  # rows promised in this plan, beside the running ones
        if self._prefilling is not None:
            plan.resumed = self._chunk(self._prefilling, budget)
            budget -= plan.resumed.size
            if not plan.resumed.last:
                return self._used(plan, budget)
            # Its last chunk, even one that takes the whole budget: it is not resumed again (an
            # empty chunk of a finished prompt would be).
            pending_rows += self._prefilling.candidates
            self._prefilling = None
        waiting = self.admission.waiting
        while budget > 0 and waiting and self._fits(waiting[0], running_rows + pending_rows):
            head = waiting[0]
            if head.request.media is not None:
                if not plan.batch:  # media inputs are per request: its prefill runs alone, whole
                    plan.media = self._admit()
                break
            cached = lookup(head)
            size = len(head.request.prompt_ids) - (cached or 0)
            if size == 1 and cached is not None and not head.request.params.use_beam_search:
                plan.joins.append(Admitted(self._admit(), cached))
                plan.joins[-1].group.prefill_done = len(head.request.prompt_ids)
                budget -= 1
                pending_rows += head.candidates
                continue
            if size > budget:
                if not plan.batch:  # too long for one step: prefill it in chunks from now on
                    self._prefilling = self._admit()
                    self._prefilling.prefill_done = cached or 0
                    plan.started = self._chunk(self._prefilling, budget, cached or 0)
                    budget -= plan.started.size
                break
            plan.batch.append(Admitted(self._admit(), cached or 0))
            budget -= size
            pending_rows += head.candidates
        return self._used(plan, budget)

    # --- results --------------------------------------------------------------------------------
    def update(self, plan: StepPlan, sampled: list[Sampled]) -> list[Outcome | None]:
        """Learn what this step's passes did so far (called after each pass that sampled): the
        plan's completed prompts run, and each row in ``sampled`` goes on or ended. One outcome per
        row, in order; None for a row whose request has already left."""
        for joined in plan.completed:
            request_id = joined.request.request_id
            if self._groups.get(request_id) is joined:  # a failed prefill has been discarded
                self._running[request_id] = joined
        outcomes: list[Outcome | None] = []
        for row in sampled:
            group = self._groups.get(row.request_id)
            if group is None:
                outcomes.append(None)
                continue
            if group.request.params.use_beam_search:
                final = row.ended  # the search is over for all its beams at once
            else:
                group.finished += row.ended
                final = group.finished == group.candidates
            if final:
                self.finish(group)
            outcomes.append(Outcome(group, final))
        return outcomes

    def finish(self, group: RequestGroup) -> None:
        """A request was answered: it leaves and gives its reservation back."""
        if self._groups.pop(group.request.request_id, None) is not None:
            self._running.pop(group.request.request_id, None)
            self.admission.release(group)

    def discard(self, group: RequestGroup) -> bool:
        """A request leaves early (cancelled, failed, shut down), wherever it is; False if it
        had already left."""
        if self._groups.pop(group.request.request_id, None) is None:
            return False
        self._running.pop(group.request.request_id, None)
        self.admission.withdraw(group)
        if self._prefilling is group:
            self._prefilling = None
        return True

    def abandon(self) -> list[RequestGroup]:
        """Every request, taken off the books without any bookkeeping (the engine failed)."""
        groups = [*self._groups.values(), *self.admission.drain()]
        self._groups.clear()
        self._running.clear()
        return groups

    # --- internals ------------------------------------------------------------------------------
    def _fits(self, group: RequestGroup, held_rows: int) -> bool:
        return self.admission.can_admit(group, self._max_rows - held_rows)

    def _admit(self) -> RequestGroup:
        group = self.admission.admit()
        group.prefill_started = time.perf_counter()
        return group

    def _chunk(self, group: RequestGroup, budget: int, cached: int = 0) -> PrefillChunk:
        """The next chunk of ``group``'s prompt; its progress counts as done from here."""
        start = group.prefill_done
        end = min(start + budget, len(group.request.prompt_ids))
        group.prefill_done = end
        return PrefillChunk(group, start, end, cached)

    def _used(self, plan: StepPlan, budget_left: int) -> StepPlan:
        plan.tokens = self._token_budget - budget_left
        return plan
