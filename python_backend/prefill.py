"""Prefill: turning admitted prompts into KV-cache rows and first tokens, within a token budget.

Owns the prefill half of the engine's step: short prompts prefilled together in one left-padded
forward pass, a prompt longer than the budget in chunks across steps (so running streams keep
decoding), and a media prompt alone with its model inputs. ``PrefillSteps`` is a base of
``Engine`` and works on the engine's state, which it declares here; the engine thread alone runs it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from python_backend.admission import Admission, RequestGroup
from python_backend.contract import ErrorInfo
from python_backend.kv_cache import BatchCache
from python_backend.loader import LoadedModel
from python_backend.multimodal.positions import media_prefill_inputs
from python_backend.sequence import EngineEvent, Sequence
from python_backend.settings import EngineSettings

logger = logging.getLogger(__name__)

# The error a request gets when a forward pass fails under it (the details go to the log).
INTERNAL_ERROR = ErrorInfo(500, "internal error while generating; the request was stopped", "internal_error")


class PrefillSteps:
    # The engine's state and steps this part uses (defined by Engine).
    _loaded: LoadedModel
    _settings: EngineSettings
    _admission: Admission
    _running: list[Sequence]
    _prefilling: RequestGroup | None
    _forward: Callable[..., Any]
    _remove: Callable[[RequestGroup, EngineEvent], None]
    _start_sequences: Callable[..., None]

    def _prefill_step(self) -> None:
        """Prefill within the token budget: a long prompt in chunks, short ones batched together."""
        budget = self._settings.max_num_batched_tokens
        if self._prefilling is not None:
            budget -= self._prefill_chunk(self._prefilling, budget)
            if self._prefilling is not None or budget <= 0:
                return
        batch: list[RequestGroup] = []
        waiting = self._admission.waiting
        while budget > 0 and waiting and self._can_admit(waiting[0], sum(g.candidates for g in batch)):
            if self._admission.waiting[0].request.media is not None:
                if not batch:  # media inputs are per request: its prefill runs alone, whole
                    self._prefill_media(self._admit())
                break
            size = len(self._admission.waiting[0].request.prompt_ids)
            if size > budget:
                if not batch:  # too long for one step: prefill it in chunks from now on
                    self._prefilling = self._admit()
                    self._prefill_chunk(self._prefilling, budget)
                break
            batch.append(self._admit())
            budget -= size
        if batch:
            self._prefill_batch(batch)

    def _can_admit(self, group: RequestGroup, pending_rows: int) -> bool:
        """Room for the head of the queue: sequence seats and KV budget (FIFO, no overtaking)."""
        seats = self._settings.max_num_seqs - len(self._running) - self._admitted_rows - pending_rows
        return self._admission.can_admit(group, seats)

    def _admit(self) -> RequestGroup:
        group = self._admission.admit()
        group.prefill_cache = BatchCache()
        group.prefill_started = time.perf_counter()
        return group

    @property
    def _admitted_rows(self) -> int:
        """Rows promised to a request whose chunked prefill is still running."""
        return self._prefilling.candidates if self._prefilling is not None else 0

    def _prefill_chunk(self, group: RequestGroup, budget: int) -> int:
        """One chunk of a long prompt; returns the tokens it used."""
        prompt = group.request.prompt_ids
        chunk = prompt[group.prefill_done : group.prefill_done + budget]
        device = self._loaded.device
        start = group.prefill_done
        try:
            out = self._forward(
                [group.request.params.lora],
                group.prefill_cache,
                input_ids=torch.tensor([chunk], dtype=torch.long, device=device),
                position_ids=torch.arange(start, start + len(chunk), device=device).unsqueeze(0),
                logits_to_keep=1,
            )
        except Exception:
            logger.exception("prefill failed for %s", group.request.request_id)
            self._prefilling = None
            self._remove(group, EngineEvent(group.request.request_id, error=INTERNAL_ERROR, final=True))
            return len(chunk)
        group.prefill_done += len(chunk)
        if group.prefill_done == len(prompt):
            self._prefilling = None
            cache = group.prefill_cache
            group.prefill_cache = None
            if cache is None:
                raise RuntimeError("prefill finished without a cache")
            self._start_sequences(group, out.logits[0, -1:, :], cache, row=0, pad=0)
        return len(chunk)

    def _prefill_batch(self, groups: list[RequestGroup]) -> None:
        """Prefill several short prompts in one forward pass, left-padded to a common length."""
        device = self._loaded.device
        prompts = [g.request.prompt_ids for g in groups]
        width = max(len(p) for p in prompts)
        pads = [width - len(p) for p in prompts]
        input_ids = torch.tensor([[0] * pad + p for pad, p in zip(pads, prompts, strict=True)], dtype=torch.long)
        mask = torch.tensor([[0] * pad + [1] * len(p) for pad, p in zip(pads, prompts, strict=True)], dtype=torch.long)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = BatchCache()
        try:
            out = self._forward(
                [g.request.params.lora for g in groups],
                cache,
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                logits_to_keep=1,
            )
        except Exception:
            logger.exception("batched prefill of %d requests failed", len(groups))
            for group in groups:
                self._remove(group, EngineEvent(group.request.request_id, error=INTERNAL_ERROR, final=True))
            return
        for row, group in enumerate(groups):
            group.prefill_done = len(group.request.prompt_ids)
            group.prefill_cache = None
            self._start_sequences(group, out.logits[row, -1:, :], cache, row=row, pad=pads[row])

    def _prefill_media(self, group: RequestGroup) -> None:
        """Prefill a request with images, video or audio: batch of one, the whole prompt."""
        request, loaded = group.request, self._loaded
        if request.media is None:
            raise RuntimeError("not a media request")
        cache = BatchCache()
        try:
            prefill = media_prefill_inputs(
                loaded.transformers_model,
                request.prompt_ids,
                request.media,
                loaded.device,
                loaded.dtype,
                loaded.uses_mrope,
            )
            out = self._forward([request.params.lora], cache, logits_to_keep=1, **prefill.inputs)
        except Exception:
            logger.exception("media prefill failed for %s", request.request_id)
            self._remove(group, EngineEvent(request.request_id, error=INTERNAL_ERROR, final=True))
            return
        request.media = None  # the pixels / features are not needed after prefill: free them now
        group.prefill_done = len(request.prompt_ids)
        group.prefill_cache = None
        self._start_sequences(group, out.logits[0, -1:, :], cache, row=0, pad=0, rope_delta=prefill.rope_delta)
