"""Prefill execution: turning admitted prompts into KV-cache rows and first-token logits.

Owns the forward passes of the prefill half of a step, as the scheduler (``scheduler.py``) planned
them: a chunk of a long prompt (its cache carried across steps), short prompts together in one
left-padded pass, a media prompt alone with its model inputs; and the prefix cache's traffic. A
text prompt that starts like a cached one (prefix_cache.py) starts from the cached keys/values and
computes only the rest; every prefilled prompt, and every finished one-choice answer, is offered
to the cache. A request with ``prompt_logprobs`` never starts from the cache (its cached positions
were never scored) but still offers its prompt to it; its passes score its prompt tokens as they
go (``prompt_scores.py``), chunk by chunk for a long prompt. ``Prefiller`` returns what it computed
(``PrefillResult``); the engine adds the rows to the running batch and samples. What a prefill
keeps between passes (a long prompt's cache, its prefix hit, its prompt log-probabilities) is the
request's ``Execution`` (``execution.py``). The engine thread alone runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from python_backend.cpu.fast_decode import PromptSegment
from python_backend.engine.batch_cache import BatchCache
from python_backend.engine.execution import Executions
from python_backend.engine.kv_cache import KVBatch, left_pad
from python_backend.engine.prefix_cache import LayerStates, PrefixCache, PrefixHit
from python_backend.engine.prompt_scores import HeadInput, PromptScorer
from python_backend.engine.request import EngineRequest, RequestGroup, rows_needed
from python_backend.engine.scheduler import PrefillChunk, StepPlan
from python_backend.engine.sequence import Sequence
from python_backend.model.loader import LoadedModel
from python_backend.prompt.multimodal.positions import media_prefill_inputs
from python_backend.protocol.errors import internal
from python_backend.text.token_text import TokenTexts

logger = logging.getLogger(__name__)

# The error a request gets when a forward pass fails under it (the details go to the log).
INTERNAL_ERROR = internal("internal error while generating; the request was stopped")

# One forward pass: (each row's LoRA adapter, the cache to extend, **model inputs) -> model output.
Forward = Callable[..., Any]


@dataclass
class Prefilled:
    """A prompt whose prefill is complete: its keys/values are row ``row`` of ``cache``."""

    group: RequestGroup
    logits: torch.Tensor  # the last position's logits, [1, vocab]
    cache: BatchCache
    row: int = 0
    pad: int = 0
    rope_delta: int = 0


@dataclass
class OpenSegment:
    """A request's prompt tokens computed inside this step's mixed forward pass."""

    group: RequestGroup
    segment: PromptSegment[BatchCache]
    cached: int = 0  # prompt tokens its cache started from (the prefix cache), for the first segment


@dataclass
class PrefillResult:
    ready: list[Prefilled] = field(default_factory=list)
    failed: list[RequestGroup] = field(default_factory=list)  # a forward pass failed under them


class Prefiller:
    def __init__(self, loaded: LoadedModel, prefix: PrefixCache, runs: Executions) -> None:
        self._loaded = loaded
        self._prefix = prefix
        self._runs = runs
        self._scorer = PromptScorer(loaded.transformers_model, TokenTexts(loaded.tokenizer))

    def check_request(self, request: EngineRequest) -> None:
        """Refuse (400) a ``prompt_logprobs`` request this model cannot score."""
        if request.params.prompt_logprobs is not None:
            self._scorer.check_request(request.media is not None)

    def lookup(self, group: RequestGroup) -> PrefixHit | None:
        if _scores(group):
            return None  # cached positions have no logits to score
        return self._prefix.lookup(group.request.prompt_ids, _namespace(group.request))

    def offer_finished(self, running: list[Sequence], kv: KVBatch, rows: list[int]) -> None:
        """Keep finished answers' keys/values, prompt and output, for the conversation's next
        turn: its prompt repeats this one and the answer. ``rows`` index the running batch."""
        if not self._prefix.enabled:
            return
        for i in rows:
            seq = running[i]
            request = seq.request
            if request.params.use_beam_search or rows_needed(request) != 1:
                continue  # beams move between rows; best_of keeps only some candidates
            tokens = request.prompt_ids + seq.tokens[:-1]  # the last token was never fed back
            # Stored in the prefill caches' dtype (the batch may keep float32 under a 16-bit model).
            dtype = self._loaded.prompt_kv_dtype
            states: LayerStates = [(k.to(dtype), v.to(dtype)) for k, v in KVBatch.row_states(kv.cache, i, kv.pad[i])]
            if states[0][0].shape[-2] == len(tokens):
                self._prefix.insert(tokens, states, _namespace(request))

    def _new_cache(self) -> BatchCache:
        """A prefill's own cache, in ``prompt_kv_dtype`` (loader.py)."""
        return BatchCache(self._loaded.prompt_kv_dtype)

    def _offer_prefix(self, group: RequestGroup, cache: BatchCache, row: int, pad: int) -> None:
        """Keep a prefilled prompt's keys/values for later prompts that start the same way."""
        if self._prefix.enabled:
            request = group.request
            self._prefix.insert(request.prompt_ids, KVBatch.row_states(cache, row, pad), _namespace(request))

    def segments(self, plan: StepPlan, hits: dict[str, PrefixHit]) -> list[OpenSegment] | None:
        """The plan's prompt work as segments of one mixed step with the decode rows, or None
        where some of it needs the model's own forward (media inputs, prompt scoring)."""
        if plan.media is not None:
            return None
        admitted = [a.group for a in plan.batch]
        chunks = [c for c in (plan.resumed, plan.started) if c is not None]
        if any(_scores(g) for g in admitted + [c.group for c in chunks]):
            return None
        opened = []
        if plan.resumed is not None:
            opened.append(self._chunk_segment(plan.resumed, None))
        for entry in plan.batch:
            group = entry.group
            cache = self._new_cache()
            hit = hits.get(group.request.request_id)
            if hit is not None and entry.cached:
                cache.set_layer_states(hit.layer_slice(entry.cached))  # copied into its own cache
            prompt = group.request.prompt_ids
            opened.append(
                OpenSegment(group, PromptSegment(prompt[entry.cached :], entry.cached, cache, True), entry.cached)
            )
        if plan.started is not None:
            opened.append(self._chunk_segment(plan.started, hits.get(plan.started.group.request.request_id)))
        return opened

    def _chunk_segment(self, chunk: PrefillChunk, hit: PrefixHit | None) -> OpenSegment:
        group = chunk.group
        run = self._runs.of(group)
        if run.prefill_cache is None:
            run.prefill_cache = self._new_cache()
            if hit is not None and chunk.cached:
                run.prefill_cache.set_layer_states(hit.states)
                run.cached_tokens = chunk.cached
        tokens = group.request.prompt_ids[chunk.start : chunk.end]
        return OpenSegment(group, PromptSegment(tokens, chunk.start, run.prefill_cache, chunk.last), run.cached_tokens)

    def close_segments(self, opened: list[OpenSegment], logits: list[torch.Tensor | None]) -> PrefillResult:
        """After the mixed pass: the prompts it completed, ready to join the running batch."""
        result = PrefillResult()
        for entry, last in zip(opened, logits, strict=True):
            if last is None:
                continue  # a chunk of a long prompt: its cache carries on to the next step
            group = entry.group
            group.prefill_done = len(group.request.prompt_ids)
            run = self._runs.of(group)
            run.prefill_cache = None
            run.prefix_hit = None
            run.cached_tokens = entry.cached
            self._offer_prefix(group, entry.segment.cache, row=0, pad=0)
            result.ready.append(Prefilled(group, last, entry.segment.cache))
        return result

    def chunk(self, chunk: PrefillChunk, hit: PrefixHit | None, forward: Forward) -> PrefillResult:
        """Compute one chunk of a long prompt (``hit``: the cached keys/values of its first)."""
        group = chunk.group
        run = self._runs.of(group)
        if run.prefill_cache is None:
            run.prefill_cache = self._new_cache()
            if hit is not None and chunk.cached:
                run.prefill_cache.set_layer_states(hit.states)  # copied into the request's own cache
                run.cached_tokens = chunk.cached
        tokens = group.request.prompt_ids[chunk.start : chunk.end]
        device = self._loaded.device
        wanted = _scores(group)
        try:
            with self._scorer.capture(wanted) as kept:
                out = forward(
                    [group.request.params.lora],
                    run.prefill_cache,
                    input_ids=torch.tensor([tokens], dtype=torch.long, device=device),
                    position_ids=torch.arange(chunk.start, chunk.end, device=device).unsqueeze(0),
                    logits_to_keep=0 if wanted else 1,
                )
            if wanted:
                self._score(group, kept, 0, chunk.start, chunk.end, out.logits[0, -1] if chunk.last else None)
        except Exception:
            logger.exception("prefill failed for %s", group.request.request_id)
            return PrefillResult(failed=[group])
        if not chunk.last:
            return PrefillResult()
        cache, run.prefill_cache = run.prefill_cache, None
        self._offer_prefix(group, cache, row=0, pad=0)
        return PrefillResult(ready=[Prefilled(group, out.logits[0, -1:, :], cache)])

    def batch(self, groups: list[RequestGroup], forward: Forward) -> PrefillResult:
        """Prefill short prompts (``prefix_hit`` set where cached): those with a cached prefix in
        one pass, the others in another."""
        result = PrefillResult()
        hits = [g for g in groups if self._runs.of(g).prefix_hit is not None]
        misses = [g for g in groups if self._runs.of(g).prefix_hit is None]
        for part in (misses, hits):
            if part:
                done = self._prefill_rows(part, forward)
                result.ready += done.ready
                result.failed += done.failed
        return result

    def _prefill_rows(self, groups: list[RequestGroup], forward: Forward) -> PrefillResult:
        """Prefill several prompts in one forward pass, left-padded to a common length.

        Every row computes the same number of new tokens (``width``: the longest uncached part);
        a row whose uncached part is shorter recomputes the end of its cached prefix instead of
        being padded in the middle, so each row's keys/values stay one left-padded run. Rows
        start from ``reuse[i]`` cached positions, left-padded to ``past``.
        """
        device = self._loaded.device
        prompts = [g.request.prompt_ids for g in groups]
        prefix_hits = [self._runs.of(g).prefix_hit for g in groups]
        cached = [hit.tokens if hit is not None else 0 for hit in prefix_hits]
        width = max(len(p) - c for p, c in zip(prompts, cached, strict=True))
        reuse = [max(0, len(p) - width) for p in prompts]
        past = max(reuse)
        pads = [past + width - len(p) for p in prompts]
        input_ids = torch.tensor(
            [[0] * (width - len(p) + r) + p[r:] for p, r in zip(prompts, reuse, strict=True)], dtype=torch.long
        )
        mask = torch.tensor([[0] * pad + [1] * len(p) for pad, p in zip(pads, prompts, strict=True)], dtype=torch.long)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, past:]
        cache = self._new_cache()
        wanted = any(_scores(g) for g in groups)
        try:
            if past:
                cache.set_layer_states(self._cached_rows(prefix_hits, reuse, past))
            with self._scorer.capture(wanted) as kept:
                out = forward(
                    [g.request.params.lora for g in groups],
                    cache,
                    input_ids=input_ids.to(device),
                    attention_mask=mask.to(device),
                    position_ids=positions.to(device),
                    logits_to_keep=0 if wanted else 1,
                )
            for row, group in enumerate(groups):
                if _scores(group):  # never a cache hit: its whole prompt ends at the last column
                    first = width - len(prompts[row])
                    self._score(group, kept, row, 0, len(prompts[row]), out.logits[row, -1], first)
        except Exception:
            logger.exception("batched prefill of %d requests failed", len(groups))
            return PrefillResult(failed=list(groups))
        result = PrefillResult()
        for row, group in enumerate(groups):
            group.prefill_done = len(group.request.prompt_ids)
            run = self._runs.of(group)
            run.prefill_cache = None
            run.prefix_hit = None
            run.cached_tokens = reuse[row]
            self._offer_prefix(group, cache, row=row, pad=pads[row])
            result.ready.append(Prefilled(group, out.logits[row, -1:, :], cache, row=row, pad=pads[row]))
        return result

    def _score(
        self,
        group: RequestGroup,
        kept: HeadInput,
        row: int,
        start: int,
        end: int,
        last_logits: torch.Tensor | None,
        column: int = 0,
    ) -> None:
        """Score the prompt tokens after positions ``start..end-1``, whose head input is row
        ``row`` of ``kept`` from ``column`` on; ``last_logits``: the model's own logits of the
        prompt's last position, when this pass holds it (a check that the scorer matches)."""
        request = group.request
        if kept.hidden is None:
            raise RuntimeError("the output head's input was not captured")
        hidden = kept.hidden[row, column : column + end - start]
        if last_logits is not None:
            self._scorer.check_last(hidden, last_logits)
        targets = request.prompt_ids[start + 1 : end + 1]  # each position predicts the next token
        scored = self._scorer.score(hidden[: len(targets)], targets, request.params.prompt_logprobs or 0)
        run = self._runs.of(group)
        if start == 0:
            run.prompt_logprobs = [self._scorer.first(request.prompt_ids[0])]
        if run.prompt_logprobs is None:
            raise RuntimeError("a later prompt chunk was scored before the first")
        run.prompt_logprobs.extend(scored)

    @staticmethod
    def _cached_rows(
        hits: list[PrefixHit | None], reuse: list[int], past: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the rows' cached keys/values left-padded to ``past`` positions."""
        template = next(hit for hit, r in zip(hits, reuse, strict=True) if r and hit)
        per_row = []
        for hit, count in zip(hits, reuse, strict=True):
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

    def media(self, group: RequestGroup, forward: Forward) -> PrefillResult:
        """Prefill a request with images, video or audio: batch of one, the whole prompt."""
        request, loaded = group.request, self._loaded
        if request.media is None:
            raise RuntimeError("not a media request")
        cache = self._new_cache()
        try:
            prefill = media_prefill_inputs(
                loaded.transformers_model,
                request.prompt_ids,
                request.media,
                loaded.device,
                loaded.dtype,
                loaded.uses_mrope,
            )
            out = forward([request.params.lora], cache, logits_to_keep=1, **prefill.inputs)
        except Exception:
            logger.exception("media prefill failed for %s", request.request_id)
            return PrefillResult(failed=[group])
        request.media = None  # the pixels / features are not needed after prefill: free them now
        group.prefill_done = len(request.prompt_ids)
        self._runs.of(group).prefill_cache = None
        return PrefillResult(ready=[Prefilled(group, out.logits[0, -1:, :], cache, rope_delta=prefill.rope_delta)])


def _scores(group: RequestGroup) -> bool:
    return group.request.params.prompt_logprobs is not None


def _namespace(request: EngineRequest) -> str:
    """Prefix-cache entries are per LoRA adapter: an adapter changes every layer's keys/values."""
    return request.params.lora or ""
