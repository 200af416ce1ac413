"""Prefill: turning admitted prompts into KV-cache rows and first tokens, within a token budget.

Owns the prefill half of the engine's step: short prompts prefilled together in one left-padded
forward pass, a prompt longer than the budget in chunks across steps (so running streams keep
decoding), and a media prompt alone with its model inputs; and the prefix cache's traffic. A text
prompt that starts like a cached one (prefix_cache.py) starts from the cached keys/values and
computes only the rest; every prefilled prompt, and every finished one-choice answer, is offered
to the cache. ``PrefillSteps`` is a base of ``Engine`` and works on the engine's state, which it
declares here; the engine thread alone runs it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from python_backend.engine.admission import Admission, RequestGroup, rows_needed
from python_backend.engine.kv_cache import BatchCache, KVBatch, left_pad
from python_backend.engine.prefix_cache import LayerStates, PrefixCache, PrefixHit
from python_backend.engine.sequence import EngineEvent, EngineRequest, Sequence
from python_backend.model.loader import LoadedModel
from python_backend.prompt.multimodal.positions import media_prefill_inputs
from python_backend.protocol.errors import internal
from python_backend.protocol.settings import EngineSettings

logger = logging.getLogger(__name__)

# The error a request gets when a forward pass fails under it (the details go to the log).
INTERNAL_ERROR = internal("internal error while generating; the request was stopped")


class PrefillSteps:
    # The engine's state and steps this part uses (defined by Engine).
    _loaded: LoadedModel
    _settings: EngineSettings
    _admission: Admission
    _prefix: PrefixCache
    _kv: KVBatch
    _running: list[Sequence]
    _prefilling: RequestGroup | None
    _forward: Callable[..., Any]
    _remove: Callable[[RequestGroup, EngineEvent], None]
    _start_sequences: Callable[..., None]
    _add_sequences: Callable[..., None]

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
            hit = self._lookup(waiting[0])
            size = len(waiting[0].request.prompt_ids) - (hit.tokens if hit is not None else 0)
            if size == 1 and hit is not None and not waiting[0].request.params.use_beam_search:
                self._join_cached(self._admit(hit), hit)
                budget -= 1
                continue
            if size > budget:
                if not batch:  # too long for one step: prefill it in chunks from now on
                    self._prefilling = self._admit(hit)
                    self._prefill_chunk(self._prefilling, budget)
                break
            batch.append(self._admit(hit))
            budget -= size
        if batch:
            self._prefill_batch(batch)

    def _can_admit(self, group: RequestGroup, pending_rows: int) -> bool:
        """Room for the head of the queue: sequence seats and KV budget (FIFO, no overtaking)."""
        seats = self._settings.max_num_seqs - len(self._running) - self._admitted_rows - pending_rows
        return self._admission.can_admit(group, seats)

    def _lookup(self, group: RequestGroup) -> PrefixHit | None:
        return self._prefix.lookup(group.request.prompt_ids, _namespace(group.request))

    def _admit(self, hit: PrefixHit | None = None) -> RequestGroup:
        group = self._admission.admit()
        group.prefill_cache = BatchCache()
        group.prefill_started = time.perf_counter()
        group.prefix_hit = hit
        return group

    def _join_cached(self, group: RequestGroup, hit: PrefixHit) -> None:
        """A prompt cached up to its last token needs no forward pass of its own: it joins the
        running batch, and the next decode step feeds that last token and samples the first
        output token beside every other row (telemetry: that step's batch size and time)."""
        group.prefill_done = len(group.request.prompt_ids)
        group.prefill_cache = None
        group.prefix_hit = None
        group.cached_tokens = hit.tokens
        self._add_sequences(group, hit.states)

    def _offer_prefix(self, group: RequestGroup, cache: BatchCache, row: int, pad: int) -> None:
        """Keep a prefilled prompt's keys/values for later prompts that start the same way."""
        if self._prefix.enabled:
            request = group.request
            self._prefix.insert(request.prompt_ids, KVBatch.row_states(cache, row, pad), _namespace(request))

    def _offer_finished(self, rows: list[int]) -> None:
        """Keep finished answers' keys/values, prompt and output, for the conversation's next
        turn: its prompt repeats this one and the answer. ``rows`` index the running batch."""
        if not self._prefix.enabled:
            return
        for i in rows:
            seq = self._running[i]
            request = seq.request
            if request.params.use_beam_search or rows_needed(request) != 1:
                continue  # beams move between rows; best_of keeps only some candidates
            tokens = request.prompt_ids + seq.tokens[:-1]  # the last token was never fed back
            # Stored in the model's dtype, as prefill caches are (the batch may keep float32).
            dtype = self._loaded.dtype
            states: LayerStates = [
                (k.to(dtype), v.to(dtype)) for k, v in KVBatch.row_states(self._kv.cache, i, self._kv.pad[i])
            ]
            if states[0][0].shape[-2] == len(tokens):
                self._prefix.insert(tokens, states, _namespace(request))

    @property
    def _admitted_rows(self) -> int:
        """Rows promised to a request whose chunked prefill is still running."""
        return self._prefilling.candidates if self._prefilling is not None else 0

    def _prefill_chunk(self, group: RequestGroup, budget: int) -> int:
        """One chunk of a long prompt; returns the tokens it used."""
        prompt = group.request.prompt_ids
        hit, group.prefix_hit = group.prefix_hit, None
        if hit is not None and group.prefill_done == 0 and group.prefill_cache is not None:
            group.prefill_cache.set_layer_states(hit.states)  # copied into the group's own cache
            group.prefill_done = group.cached_tokens = hit.tokens
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
            self._offer_prefix(group, cache, row=0, pad=0)
            self._start_sequences(group, out.logits[0, -1:, :], cache, row=0, pad=0)
        return len(chunk)

    def _prefill_batch(self, groups: list[RequestGroup]) -> None:
        """Prefill short prompts: those with a cached prefix in one pass, the others in another."""
        hits = [g for g in groups if g.prefix_hit is not None]
        misses = [g for g in groups if g.prefix_hit is None]
        for part in (misses, hits):
            if part:
                self._prefill_rows(part)

    def _prefill_rows(self, groups: list[RequestGroup]) -> None:
        """Prefill several prompts in one forward pass, left-padded to a common length.

        Every row computes the same number of new tokens (``width``: the longest uncached part);
        a row whose uncached part is shorter recomputes the end of its cached prefix instead of
        being padded in the middle, so each row's keys/values stay one left-padded run. Rows
        start from ``reuse[i]`` cached positions, left-padded to ``past``.
        """
        device = self._loaded.device
        prompts = [g.request.prompt_ids for g in groups]
        cached = [g.prefix_hit.tokens if g.prefix_hit is not None else 0 for g in groups]
        width = max(len(p) - c for p, c in zip(prompts, cached, strict=True))
        reuse = [max(0, len(p) - width) for p in prompts]
        past = max(reuse)
        pads = [past + width - len(p) for p in prompts]
        input_ids = torch.tensor(
            [[0] * (width - len(p) + r) + p[r:] for p, r in zip(prompts, reuse, strict=True)], dtype=torch.long
        )
        mask = torch.tensor([[0] * pad + [1] * len(p) for pad, p in zip(pads, prompts, strict=True)], dtype=torch.long)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, past:]
        cache = BatchCache()
        try:
            if past:
                cache.set_layer_states(self._cached_rows(groups, reuse, past))
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
            group.prefix_hit = None
            group.cached_tokens = reuse[row]
            self._offer_prefix(group, cache, row=row, pad=pads[row])
            self._start_sequences(group, out.logits[row, -1:, :], cache, row=row, pad=pads[row])

    @staticmethod
    def _cached_rows(
        groups: list[RequestGroup], reuse: list[int], past: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the rows' cached keys/values left-padded to ``past`` positions."""
        template = next(g.prefix_hit for g, r in zip(groups, reuse, strict=True) if r and g.prefix_hit)
        per_row = []
        for group, count in zip(groups, reuse, strict=True):
            hit = group.prefix_hit
            if hit is not None and count:
                per_row.append(
                    [(left_pad(k, past - count), left_pad(v, past - count)) for k, v in hit.layer_slice(count)]
                )
            else:
                per_row.append([(k.new_zeros((1, k.shape[1], past, k.shape[3])),) * 2 for k, _v in template.states])
        return [
            (torch.cat([row[layer][0] for row in per_row]), torch.cat([row[layer][1] for row in per_row]))
            for layer in range(len(template.states))
        ]

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


def _namespace(request: EngineRequest) -> str:
    """Prefix-cache entries are per LoRA adapter: an adapter changes every layer's keys/values."""
    return request.params.lora or ""
