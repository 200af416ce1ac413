"""Beam search's part of the engine step: advancing a request's beams and answering with the best.

Owns the two steps that treat a beam-search request's ``n`` rows as one: after each forward pass,
pick every beam's parent and token (``beam_search.BeamSearch``) and move the KV rows to follow
their parents; when the search is over, send the best ``n`` hypotheses at once (MindIE's
pseudo-streaming). Plain functions: the engine passes the batch and tokenizer they work on, and
delivers the events they return; the engine thread alone runs them.
"""

from __future__ import annotations

from typing import Any

import torch

from python_backend.engine.execution import Execution
from python_backend.engine.kv_cache import KVBatch
from python_backend.engine.request import EngineEvent
from python_backend.protocol.contract import FINISH_LENGTH


def beam_advance(
    group: Execution,
    kv: KVBatch,
    logits: torch.Tensor,
    rows: list[int] | None,
    started: float,
    ended: float,
    batch: int,
) -> None:
    """One beam-search step: pick each beam's parent and token, move ``kv``'s rows to match
    (``rows``: the group's rows in ``kv``; None for the first step, from the prefill)."""
    beam = group.beam
    if beam is None:
        raise RuntimeError("not a beam-search request")
    first = rows is None
    waits = [max(int((started - seq.ready_at) * 1e6), 0) for seq in group.sequences]
    step = beam.step(logits, waits, batch, None if first else round((ended - started) * 1e3, 2))
    if rows is not None and step.parents:
        kv.copy_rows(rows[: len(step.parents)], [rows[p] for p in step.parents])
    for seq, hypothesis in zip(group.sequences, beam.beams, strict=False):
        seq.sampling.output_ids[:] = hypothesis.tokens
        seq.ready_at = ended
    if first:
        group.prefill_ms = round((ended - group.request.arrival) * 1e3, 2)
    if beam.done or len(beam.beams) < beam.width:
        for seq in group.sequences:
            seq.finish_reason = FINISH_LENGTH  # the group is over; each answer's reason is its own


def beam_answers(group: Execution, tokenizer: Any) -> list[EngineEvent]:
    """Beam search answers all at once (MindIE's pseudo-streaming): the best n hypotheses, as
    the request's last events (the engine delivers them and ends the request)."""
    if group.beam is None:
        raise RuntimeError("not a beam-search request")
    params = group.request.params

    def decode(tokens: list[int]) -> str:
        return str(tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens))

    answers = group.beam.answers(params.n, len(group.request.prompt_ids), group.prefill_ms, decode)
    for answer in answers:
        if answer.usage is not None:
            answer.usage.cached_tokens = group.cached_tokens
    request_id = group.request.request_id
    return [EngineEvent(request_id, delta=delta, final=delta.index == len(answers) - 1) for delta in answers]
