"""What the engine asks of a tensor-parallel group: keeping every rank's engine in step.

Owns ``StepSync``, the protocol ``python_backend.parallel`` implements. Under tensor parallel
each rank runs this same engine on its shard of the model: rank 0 (the leader) takes requests,
samples and tells the others, each step, what arrived and what was cancelled, and each sampled
token; the other ranks (followers) replay it, so every rank makes the same scheduling decisions
and the same key/value-cache moves, and runs the same forward passes, whose collectives
(all-reduce, all-gather) meet. Without a group (one rank) the engine never sees one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from python_backend.engine.admission import Admission
from python_backend.engine.limits import Limits
from python_backend.sampling.sampler import RowSampling, SampledToken


class StepSync(Protocol):
    @property
    def leads(self) -> bool:
        """Rank 0: it takes requests and waits for them; followers wait on the leader instead."""
        ...

    def admission(self, max_waiting: int, kv_budget_tokens: int) -> Admission:
        """The engine's admission queue (the leader's remembers what each step took in)."""
        ...

    def agree(self, limits: Limits) -> Limits:
        """The limits every rank uses: the smallest KV budget of all ranks (budgets are per rank)."""
        ...

    def step(self, reap: Callable[[], None]) -> bool:
        """Run ``reap`` (take in arrivals, drop cancelled requests) in step with the other ranks;
        False: the group is stopping and the loop must end."""
        ...

    def sample(self, logits: torch.Tensor, rows: list[RowSampling]) -> list[SampledToken]:
        """One token per row, drawn on rank 0 and the same on every rank."""
        ...
