"""Beam search's part of the engine step: advancing a request's beams and answering with the best.

Owns the two steps that treat a beam-search request's ``n`` rows as one: after each forward pass,
pick every beam's parent and token (``beam_search.BeamSearch``) and move the KV rows to follow
their parents; when the search is over, send the best ``n`` hypotheses at once (MindIE's
pseudo-streaming). ``BeamSteps`` is a base of ``Engine`` and works on the engine's state, which it
declares here; the engine thread alone runs it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_backend.engine.admission import RequestGroup
from python_backend.engine.kv_cache import KVBatch
from python_backend.engine.sequence import EngineEvent, EngineRequest
from python_backend.model.loader import LoadedModel
from python_backend.protocol.contract import FINISH_LENGTH


class BeamSteps:
    # The engine's state and steps this part uses (defined by Engine).
    _loaded: LoadedModel
    _kv: KVBatch
    _deliver: Callable[[EngineRequest, EngineEvent], None]
    _finish_group: Callable[[RequestGroup], None]

    def _beam_advance(
        self,
        group: RequestGroup,
        logits: torch.Tensor,
        rows: list[int] | None,
        started: float,
        ended: float,
        batch: int,
    ) -> None:
        """One beam-search step: pick each beam's parent and token, move the KV rows to match."""
        beam = group.beam
        if beam is None:
            raise RuntimeError("not a beam-search request")
        first = rows is None
        waits = [max(int((started - seq.ready_at) * 1e6), 0) for seq in group.sequences]
        step = beam.step(logits, waits, batch, None if first else round((ended - started) * 1e3, 2))
        if rows is not None and step.parents:
            self._kv.copy_rows(rows[: len(step.parents)], [rows[p] for p in step.parents])
        for seq, hypothesis in zip(group.sequences, beam.beams, strict=False):
            seq.sampling.output_ids[:] = hypothesis.tokens
            seq.ready_at = ended
        if first:
            group.prefill_ms = round((ended - group.request.arrival) * 1e3, 2)
        if beam.done or len(beam.beams) < beam.width:
            for seq in group.sequences:
                seq.finish_reason = FINISH_LENGTH  # the group is over; each answer's reason is its own

    def _send_beams(self, group: RequestGroup) -> None:
        """Beam search answers all at once (MindIE's pseudo-streaming): the best n hypotheses."""
        if group.beam is None:
            raise RuntimeError("not a beam-search request")
        params = group.request.params

        def decode(tokens: list[int]) -> str:
            return str(self._loaded.tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens))

        answers = group.beam.answers(params.n, len(group.request.prompt_ids), group.prefill_ms, decode)
        for answer in answers:
            if answer.usage is not None:
                answer.usage.cached_tokens = group.cached_tokens
        for delta in answers:
            final = delta.index == len(answers) - 1
            self._deliver(group.request, EngineEvent(group.request.request_id, delta=delta, final=final))
        self._finish_group(group)
