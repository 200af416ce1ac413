"""Speculative decoding: drafts from a row's own tokens (n-gram prompt lookup) or from a draft
model (``draft_proposer.py``), verified in one step.

Owns ``NgramProposer`` (vLLM's ``ngram`` rule), the ``Proposer`` protocol both kinds follow,
``Speculator`` (which rows get drafts this step, the verify step's inputs, and its counters) and
``run_verify`` (turning the verify step's logits into each row's tokens and the cache positions to
forget). The engine calls it from its decode step; verifying a row's drafts is ``python_backend.sampling.speculative``'s.

A step speculates only when it pays and is safe for every row: rows are fed a rectangular
[rows, 1 + most drafts] block, so a row without drafts still pays for the widest row's
positions; the step speculates when at least half of the extra positions are drafts, else it is
a plain one-token step. Rows that would not get exactly their non-speculative tokens get no
drafts (grammar masks, LoRA adapters); beam search, media prompts (M-RoPE positions), rows that
report logprobs (whose values must not change in the last bits) and tensor parallel turn
speculation off for the step. The positions a row rejected are dropped
from the batch cache (``KVBatch.drop_rejected``), which compacts when holes grow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from python_backend.engine.draft_proposer import DraftProposer
from python_backend.engine.kv_cache import KVBatch
from python_backend.engine.sequence import Sequence, TokenText
from python_backend.model.draft import DraftModel
from python_backend.protocol.settings import EngineSettings
from python_backend.sampling.sampler import RowSampling, SampledToken
from python_backend.sampling.speculative import verify_drafts

# Holes a row may carry before the batch cache is compacted: a few steps' worth, or a quarter of
# the cache, so attention and memory never pay much for them and compaction stays rare.
_MIN_HOLES = 16
_HOLE_SHARE = 4


class Proposer(Protocol):
    """Where a verify step's drafts come from."""

    def propose(self, seq: Sequence, context: list[int], limit: int) -> list[int]:
        """Up to ``limit`` drafts for what follows ``context``, row ``seq``'s prompt and output."""
        ...

    def retain(self, running: list[Sequence]) -> None:
        """Forget whatever is kept for rows no longer running."""
        ...


class NgramProposer:
    """Propose what followed the longest earlier occurrence of the context's last n tokens."""

    def __init__(self, tokens: int, min_n: int, max_n: int) -> None:
        self.tokens = tokens
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, seq: Sequence, context: list[int], limit: int) -> list[int]:
        """``lookup``: a row's drafts depend on its tokens only."""
        return self.lookup(context, limit)

    def retain(self, running: list[Sequence]) -> None:
        """Nothing is kept between steps: the lookup reads the row's tokens each time."""

    def lookup(self, context: list[int], limit: int) -> list[int]:
        """Up to ``min(tokens, limit)`` drafts for what follows ``context``.

        As vLLM's rule: the longest n in [min_n, max_n] whose last-n-token suffix occurred
        before (the occurrence ends before the context's last token), the earliest such
        occurrence, and the tokens after it (fewer where the context ends first).
        """
        wanted = min(self.tokens, limit)
        total = len(context)
        if wanted <= 0 or total <= self.min_n:
            return []
        tokens = np.asarray(context, dtype=np.int64)
        # Ends of earlier occurrences: positions before the last whose token is the last token.
        ends = np.flatnonzero(tokens[:-1] == tokens[-1])
        if ends.size == 0:
            return []
        matched = np.ones(ends.size, dtype=np.int64)
        alive = np.ones(ends.size, dtype=bool)
        for back in range(1, self.max_n):
            if back >= total:
                break
            at = ends - back
            same = (at >= 0) & (tokens[np.maximum(at, 0)] == tokens[-1 - back])
            alive &= same
            matched += alive
        longest = int(matched.max())
        if longest < self.min_n:
            return []
        start = int(ends[np.flatnonzero(matched == longest)[0]]) + 1
        return [int(t) for t in tokens[start : start + wanted]]


@dataclass(frozen=True)
class DraftPlan:
    """One verify step: the drafts of each running row (in batch order; [] = none)."""

    drafts: list[list[int]]

    @property
    def width(self) -> int:
        """Positions fed per row: the last token and the most drafts of any row."""
        return 1 + max(len(d) for d in self.drafts)

    @property
    def drafted(self) -> int:
        return sum(len(d) for d in self.drafts)


@dataclass
class SpecCounters:
    """What speculation did since the engine started (engine thread writes, any thread reads)."""

    draft_tokens: int = 0  # drafts verified
    accepted_tokens: int = 0  # of which accepted
    steps: int = 0  # verify steps

    def as_stats(self) -> dict[str, int]:
        """``EngineStats``' fields for these counters."""
        return {
            "spec_decode_num_draft_tokens": self.draft_tokens,
            "spec_decode_num_accepted_tokens": self.accepted_tokens,
            "spec_decode_num_steps": self.steps,
        }


# (input ids, attention mask or None, position ids) -> [rows, width, vocab] logits.
Forward = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor]
# The plain sampler over [rows, vocab] logits, one token per row.
SampleRows = Callable[[torch.Tensor, list[RowSampling]], list[SampledToken]]
# (a row, its token) -> the row has ended.
Emit = Callable[[Sequence, SampledToken], bool]


@dataclass(frozen=True)
class StepCalls:
    """What a verify step needs from the engine."""

    forward: Forward
    sample_rows: SampleRows
    texts: TokenText  # for ``Sequence.accept``
    send: Callable[[list[Sequence]], None]  # send what these rows' newest tokens made ready


class Speculator:
    """Plans and counts the verify steps of one engine."""

    def __init__(self, proposer: Proposer, disable_above: int = 0) -> None:
        self._proposer = proposer
        self._disable_above = disable_above  # 0: never disabled by the batch size
        self.counters = SpecCounters()

    @staticmethod
    def from_settings(settings: EngineSettings, draft: DraftModel | None) -> Speculator | None:
        above = settings.speculative_disable_by_batch_size
        if draft is not None:
            return Speculator(DraftProposer(draft, settings.speculative_model_tokens), above)
        if settings.speculative_ngram_tokens <= 0:
            return None
        ngram = NgramProposer(
            settings.speculative_ngram_tokens, settings.speculative_ngram_min, settings.speculative_ngram_max
        )
        return Speculator(ngram, above)

    def retain(self, running: list[Sequence]) -> None:
        """Forget the proposer's state of rows no longer running (every step, speculating or not,
        so that a draft model's caches never outlive their rows)."""
        self._proposer.retain(running)

    def speculates(self, rows: int) -> bool:
        """Whether a step with ``rows`` running sequences may verify drafts at all."""
        return self._disable_above == 0 or rows <= self._disable_above

    def plan(self, running: list[Sequence], beams: bool) -> DraftPlan | None:
        """This step's drafts, or None for a plain one-token step (``beams``: a beam-search
        request is in the batch)."""
        # A wider pass rounds differently in the last bits (1e-6 in a logprob, float32): rows
        # that report logprobs keep the values of a plain step, so they make the step plain.
        if beams or any(
            s.rope_delta or s.request.media is not None or s.sampling.top_logprobs is not None for s in running
        ):
            return None
        drafts = [self._drafts(seq) for seq in running]
        plan = DraftPlan(drafts)
        if plan.drafted == 0 or 2 * plan.drafted < len(running) * (plan.width - 1):
            return None
        return plan

    def _drafts(self, seq: Sequence) -> list[int]:
        sampling = seq.sampling
        if sampling.grammar is not None or seq.request.params.lora:
            return []
        # Every token past the drafts' end is the step's own: at most max_new_tokens in all.
        room = seq.max_new_tokens - len(seq.tokens) - 1
        return self._proposer.propose(seq, seq.request.prompt_ids + seq.tokens, room)

    @staticmethod
    def inputs(plan: DraftPlan, running: list[Sequence], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """[rows, width] input ids and positions: each row's last token and its drafts, then
        fillers (its last token again, at its last position: never past what the row may reach);
        a filler's position in the cache is dropped after the step."""
        width = plan.width
        ids, positions = [], []
        for seq, drafts in zip(running, plan.drafts, strict=True):
            row = [seq.next_input, *drafts]
            fill = width - len(row)
            ids.append(row + [seq.next_input] * fill)
            last = seq.position + len(row) - 1
            positions.append([*range(seq.position, last + 1), *[last] * fill])
        return (
            torch.tensor(ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
        )

    def step(
        self, plan: DraftPlan, running: list[Sequence], kv: KVBatch, device: torch.device, calls: StepCalls
    ) -> None:
        """One verify step: feed, verify, add and send each row's tokens in order, forget what
        was rejected. Each token is sent as it is added, so streams get the deltas they would
        without speculation."""
        started = time.perf_counter()
        input_ids, positions = self.inputs(plan, running, device)
        mask = kv.attention_mask(plan.width, device) if kv.padded else None
        logits = calls.forward(input_ids, mask, positions)
        ended = time.perf_counter()
        batch = len(running)

        def emit(seq: Sequence, token: SampledToken) -> bool:
            first = seq.ready_at < ended  # a row's later tokens in this step cost no time of their own
            seq.accept(token, calls.texts)
            seq.record(started if first else ended, ended, batch)
            calls.send([seq])
            return seq.finish_reason is not None

        rejected, accepted = run_verify(plan, running, logits, calls.sample_rows, emit)
        trim_cache(kv, rejected)
        self.counters.steps += 1
        self.counters.draft_tokens += plan.drafted
        self.counters.accepted_tokens += accepted


def run_verify(
    plan: DraftPlan, running: list[Sequence], logits: torch.Tensor, sample_rows: SampleRows, emit: Emit
) -> tuple[list[int], int]:
    """Each row's tokens from the verify step's ``logits`` [rows, width, vocab], emitted in order;
    returns the cache positions each row must forget and the drafts accepted in all."""
    plain = [i for i, drafts in enumerate(plan.drafts) if not drafts]
    for i in plain:
        running[i].update_suppression()
    tokens = sample_rows(logits[plain, 0], [running[i].sampling for i in plain]) if plain else []
    sampled = dict(zip(plain, tokens, strict=True))
    width = plan.width
    rejected = []
    accepted = 0
    for i, seq in enumerate(running):
        if i in sampled:
            emit(seq, sampled[i])
            rejected.append(width - 1)
            continue
        emitted = 0

        def add(token: SampledToken, seq: Sequence = seq) -> bool:
            nonlocal emitted
            emitted += 1
            return emit(seq, token)

        drafts = plan.drafts[i]
        accepted += verify_drafts(logits[i, : len(drafts) + 1], drafts, seq.sampling, seq.update_suppression, add)
        # The cache holds the row's input and every fed draft; what it keeps is the input and
        # the accepted drafts before the last emitted token (that token is the next input).
        rejected.append(width - emitted)
    return rejected, accepted


def trim_cache(kv: KVBatch, rejected: list[int]) -> None:
    """Forget the rejected positions; compact once the holes grow past their allowance."""
    kv.drop_rejected(rejected)
    if kv.hole_count > max(_MIN_HOLES, kv.length // _HOLE_SHARE):
        kv.compact()
