"""What one engine step executes on the model, and the running batch it executes it on.

Owns ``StepRunner``: the running sequences (in KV-batch row order) and their ``KVBatch``, each
request's execution state (``execution.py``), the prefix cache and the ``Prefiller``, the
speculator, sampling, and each kind of pass: the mixed step (prompt tokens in the decode pass, the
lean CPU step), prefill passes of their own, the batched decode step and speculation's verify
step. The ``Scheduler`` plans each step (which prompts run, which join from the cache); this
executes the plan, joins finished prefills into the batch, samples, reports each pass's rows to
the scheduler and sends tokens (``delivery.py``), and retires finished rows into the prefix cache.
Runs on the engine thread only; the loop, the public interface and cancellation are
``engine.py``'s. Imports what ``engine.py`` does, never ``engine.py`` itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from python_backend.cpu.fast_decode import DecodeRows
from python_backend.engine.batch_cache import BatchCache
from python_backend.engine.beam_search import BeamSearch
from python_backend.engine.beam_steps import beam_advance
from python_backend.engine.delivery import Delivery, deliver
from python_backend.engine.execution import Execution, Executions
from python_backend.engine.kv_cache import KVBatch
from python_backend.engine.limits import Limits
from python_backend.engine.prefill import INTERNAL_ERROR, OpenSegment, Prefilled, Prefiller, PrefillResult
from python_backend.engine.prefix_cache import LayerStates, PrefixCache, PrefixHit
from python_backend.engine.request import EngineEvent, EngineRequest, RequestGroup
from python_backend.engine.rows import new_sequences
from python_backend.engine.scheduler import Scheduler, StepPlan
from python_backend.engine.sequence import Sequence
from python_backend.engine.speculative import DraftPlan, Speculator, StepCalls
from python_backend.engine.step_sync import StepSync
from python_backend.engine.thread_tuner import ComputeTeam
from python_backend.model.cache_keyword import cache_keyword
from python_backend.model.loader import LoadedModel
from python_backend.model.lora import adapter_names
from python_backend.protocol.settings import EngineSettings
from python_backend.sampling.sampler import sample, take_rows
from python_backend.text.token_text import TokenTexts

logger = logging.getLogger(__name__)


class StepRunner:
    """Executes the ``Scheduler``'s plan for each step on the model (engine thread only)."""

    def __init__(
        self,
        loaded: LoadedModel,
        settings: EngineSettings,
        limits: Limits,
        scheduler: Scheduler,
        team: ComputeTeam,
        ranks: StepSync | None = None,
    ) -> None:
        self._loaded = loaded
        self._scheduler = scheduler
        self._team = team
        self._sample = ranks.sample if ranks is not None else partial(sample, argmax=loaded.row_argmax)
        # Under tensor parallel a failed pass (a rank gone mid all-reduce) leaves the ranks out of
        # step: the loop fails, every request ends 503 engine_failed, and the model is restarted.
        self._one_of_ranks = ranks is not None
        self._texts = TokenTexts(loaded.tokenizer)
        self._runs = Executions()
        self._delivery = Delivery(scheduler, self._runs, loaded.tokenizer, settings.stream_interval)
        self._running: list[Sequence] = []  # in KV-batch row order
        self._plan = StepPlan()  # the step's, for the scheduler's updates
        self._kv = KVBatch(loaded.kv_dtype, settings.max_num_seqs)
        self.prefix = PrefixCache(limits.prefix_cache_tokens)
        self.prefiller = Prefiller(loaded, self.prefix, self._runs)
        self._cache_arg = cache_keyword(loaded.transformers_model)
        # Every rank would have to agree on each row's drafts and accepted count: one device only.
        self.speculator = Speculator.from_settings(settings, loaded.draft) if ranks is None else None
        # Prompt tokens ride in the decode step's pass where the lean CPU step runs; speculation's
        # verify steps (``mixes_now``) and the batch-invariant kernels keep prefill in passes of its own.
        fast = loaded.fast_decoder
        self.mixes = settings.mixed_prefill and fast is not None and fast.mixes and ranks is None

    @property
    def has_work(self) -> bool:
        return self._scheduler.has_prefill_work or bool(self._running)

    @property
    def running_rows(self) -> int:
        return len(self._running)

    @property
    def kv_bytes(self) -> int:
        return self._kv.bytes_used()

    def retain(self) -> None:
        """Forget the execution state of requests that have left, and the drafting state of rows."""
        self._runs.retain(self._scheduler.group)
        if self.speculator is not None:
            self.speculator.retain(self._running)

    def step(self, after_pass: Callable[[], None]) -> None:
        """One step: the planned prompt tokens and every running row's next token, in one pass
        where the lean step mixes them, else the prefill passes (then ``after_pass``) and the decode step."""
        plan, hits = self._plan_step()
        opened = self.prefiller.segments(plan, hits) if self.mixes_now() else None
        if opened:
            self._mixed_step(plan, hits, opened)
            return
        self._prefill_step(plan, hits)
        after_pass()
        with self._team.decode(len(self._running)):
            self.decode_step()

    def mixes_now(self) -> bool:
        """Whether this step's prompts may ride in its decode pass: not in a step that may verify drafts."""
        return self.mixes and not self._speculates_now()

    def _speculates_now(self) -> bool:
        return self.speculator is not None and self.speculator.speculates(len(self._running))

    def remove(self, group: RequestGroup, last: EngineEvent) -> None:
        """Take a request out wherever it is, free its rows and reservation, send its last event."""
        if self._scheduler.discard(group):
            self.drop(group, last)

    def drop(self, group: RequestGroup, last: EngineEvent) -> None:
        """Free the rows of a request the scheduler has let go, and send its last event."""
        if any(s.request is group.request for s in self._running):
            keep = [i for i, s in enumerate(self._running) if s.request is not group.request]
            self._running = [self._running[i] for i in self._kv.keep(keep)]
        self._runs.forget(group)
        deliver(group.request, last)

    def generated_tokens(self, group: RequestGroup) -> int:
        """Tokens a request's sequences generated so far (0 before it runs)."""
        run = self._runs.get(group)
        return sum(len(s.tokens) for s in run.sequences) if run is not None else 0

    # --- prefill ---------------------------------------------------------------------------------
    def forward(self, adapters: list[str | None], cache: BatchCache | None, **inputs: Any) -> Any:
        """One forward pass; with LoRA adapters loaded, each row names its adapter (or the base)."""
        if self._loaded.adapters:
            inputs["adapter_names"] = adapter_names(adapters)
        return self._loaded.model(use_cache=True, **inputs, **{self._cache_arg: cache})

    def _plan_step(self) -> tuple[StepPlan, dict[str, PrefixHit]]:
        """The scheduler's plan for this step, and the prefix-cache hits it was planned with."""
        hits: dict[str, PrefixHit] = {}

        def lookup(group: RequestGroup) -> int | None:
            hit = self.prefiller.lookup(group)
            if hit is None:
                return None
            hits[group.request.request_id] = hit
            return hit.tokens

        self._plan = self._scheduler.schedule(lookup)
        return self._plan, hits

    def _mixed_step(self, plan: StepPlan, hits: dict[str, PrefixHit], opened: list[OpenSegment]) -> None:
        """The plan's prompt tokens and the running rows' next tokens in one forward pass
        (``FastDecoder.mixed_logits``); the completed prompts then join and sample."""
        for joined in plan.joins:
            self._join_cached(joined.group, hits[joined.group.request.request_id])
        fast = self._loaded.fast_decoder
        assert fast is not None  # mixed steps are planned only with it (an invariant, not input)
        started = time.perf_counter()
        try:
            rows = self._decode_rows() if self._running else None
            out = fast.mixed_logits(rows, [o.segment for o in opened])
        except Exception:
            logger.exception("mixed step failed; stopping its %d prompts and the running rows", len(opened))
            for entry in opened:
                self.remove(entry.group, EngineEvent(entry.group.request.request_id, error=INTERNAL_ERROR, final=True))
            self._fail_running()
            return
        if out.decode is not None:
            self._take_decode_logits(out.decode, started)
        self._join(self.prefiller.close_segments(opened, out.segments))

    def _prefill_step(self, plan: StepPlan, hits: dict[str, PrefixHit]) -> None:
        """Execute the scheduler's prefill plan for this step in passes of its own, in the plan's order."""
        if plan.resumed is not None:
            self._join(self.prefiller.chunk(plan.resumed, None, self.forward))
        for joined in plan.joins:
            self._join_cached(joined.group, hits[joined.group.request.request_id])
        if plan.batch:
            for admitted in plan.batch:
                self._runs.of(admitted.group).prefix_hit = hits.get(admitted.group.request.request_id)
            self._join(self.prefiller.batch([a.group for a in plan.batch], self.forward))
        if plan.media is not None:
            self._join(self.prefiller.media(plan.media, self.forward))
        if plan.started is not None:
            hit = hits.get(plan.started.group.request.request_id)
            self._join(self.prefiller.chunk(plan.started, hit, self.forward))

    def _join(self, result: PrefillResult) -> None:
        if result.failed and self._one_of_ranks:
            raise RuntimeError("a prefill pass failed under tensor parallel; the ranks are out of step")
        for group in result.failed:
            self.remove(group, EngineEvent(group.request.request_id, error=INTERNAL_ERROR, final=True))
        for done in result.ready:
            self._start_sequences(done)

    def _join_cached(self, group: RequestGroup, hit: PrefixHit) -> None:
        """A prompt cached up to its last token needs no forward pass of its own: it joins the
        running batch, and the next decode step feeds that last token and samples the first
        output token beside every other row (telemetry: that step's batch size and time)."""
        run = self._runs.of(group)
        run.cached_tokens = hit.tokens
        self._add_sequences(run, hit.states)

    def _add_sequences(
        self, run: Execution, states: LayerStates, pad: int = 0, rope_delta: int = 0, own: BatchCache | None = None
    ) -> None:
        """The request's sequences join the running batch with these prompt keys/values; ``own``:
        the prefill's cache holding just them, which an empty batch takes without a copy."""
        run.sequences = new_sequences(self._loaded, run, rope_delta)
        if own is None or run.candidates != 1 or pad or not self._kv.adopt(own):
            self._kv.add_states(states, run.candidates, pad=pad)
        self._running.extend(run.sequences)

    def _start_sequences(self, done: Prefilled) -> None:
        """After its prefill: the request joins the batch and samples its first token."""
        logits, group = done.logits, done.group
        request, run = group.request, self._runs.of(group)
        states = KVBatch.row_states(done.cache, done.row)
        self._add_sequences(run, states, done.pad, done.rope_delta, own=done.cache)
        if request.params.use_beam_search:
            eos = frozenset() if request.params.ignore_eos else self._loaded.eos_token_ids
            run.beam = BeamSearch(group.candidates, group.max_new_tokens, eos)
            ended = time.perf_counter()
            beam_advance(run, self._kv, logits.expand(group.candidates, -1), None, group.prefill_started, ended, 1)
            self._after_tokens(run.sequences)
            return
        for seq in run.sequences:
            seq.update_suppression()
        sampled = self._sample(logits.expand(group.candidates, -1), [s.sampling for s in run.sequences])
        ended = time.perf_counter()
        for seq, token in zip(run.sequences, sampled, strict=True):
            seq.accept(token, self._texts)
            seq.record(group.prefill_started, ended, group.candidates)
        self._after_tokens(run.sequences)

    # --- decode ----------------------------------------------------------------------------------
    def decode_step(self) -> None:
        """Every running row's next token: a verify step where drafts were proposed, else one pass."""
        if not self._running:
            return
        if self.speculator is not None and self._speculates_now():
            with_beams = any(self._group(s.request).beam is not None for s in self._running)
            try:
                plan = self.speculator.plan(self._running, with_beams)  # a draft model's passes
            except Exception:
                self._fail_running()
                return
            if plan is not None:
                self._verify_step(plan)
                return
        started = time.perf_counter()
        try:
            rows = self._decode_rows()
            fast = self._loaded.fast_decoder
            if fast is not None:
                logits = fast.logits(rows.input_ids, rows.position_ids, rows.cache, rows.keep)
            else:
                adapters = [s.request.params.lora for s in self._running]
                mask = rows.keep.long() if rows.keep is not None else None
                out = self.forward(
                    adapters, rows.cache, input_ids=rows.input_ids, attention_mask=mask, position_ids=rows.position_ids
                )
                logits = out.logits[:, -1, :]
        except Exception:
            self._fail_running()
            return
        self._take_decode_logits(logits, started)

    def _decode_rows(self) -> DecodeRows[BatchCache]:
        """The running rows' inputs of a decode step."""
        device = self._loaded.device
        input_ids = torch.tensor([[s.next_input] for s in self._running], dtype=torch.long, device=device)
        position_ids = torch.tensor([[s.position] for s in self._running], dtype=torch.long, device=device)
        # Without padding no mask is needed, and transformers then takes its faster path.
        keep = self._kv.attention_mask(1, device).bool() if self._kv.padded else None
        return DecodeRows(input_ids, position_ids, self._kv.cache, keep)

    def _take_decode_logits(self, logits: torch.Tensor, started: float) -> None:
        """Sample (or advance beams) from a decode step's [rows, vocab] logits and send the tokens."""
        try:
            plain: list[int] = []
            beams: dict[str, list[int]] = {}
            for i, seq in enumerate(self._running):
                if self._group(seq.request).beam is None:
                    plain.append(i)
                    seq.update_suppression()
                else:
                    beams.setdefault(seq.request.request_id, []).append(i)
            sampled = (
                self._sample(take_rows(logits, plain), [self._running[i].sampling for i in plain]) if plain else []
            )
        except Exception:
            self._fail_running()
            return
        ended = time.perf_counter()
        batch = len(self._running)
        for i, token in zip(plain, sampled, strict=True):
            self._running[i].accept(token, self._texts)
            self._running[i].record(started, ended, batch)
        for request_id, rows in beams.items():
            beam_advance(self._group_by_id(request_id), self._kv, logits[rows], rows, started, ended, batch)
        self._after_tokens(list(self._running))

    def _fail_running(self) -> None:
        if self._one_of_ranks:
            raise RuntimeError("a decode step failed under tensor parallel; the ranks are out of step")
        logger.exception("decode step failed; stopping the %d running requests", len(self._running))
        for run in {id(s.request): self._group(s.request) for s in self._running}.values():
            self.remove(run.group, EngineEvent(run.request.request_id, error=INTERNAL_ERROR, final=True))

    def _verify_step(self, plan: DraftPlan) -> None:
        """A decode step that also feeds each row its drafts (``speculative.py``); each token is
        sent as it is accepted, so streams see the same deltas as without speculation."""
        assert self.speculator is not None  # planned only with one (an invariant, not input)
        try:
            calls = StepCalls(self._verify_forward, self._sample, self._texts, partial(self._after_tokens, drop=False))
            self.speculator.step(plan, self._running, self._kv, self._loaded.device, calls)
        except Exception:
            self._fail_running()
            return
        self._after_tokens([])

    def _verify_forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor) -> Any:
        """[rows, width, vocab] logits; the fast decoder takes one token per row, so the model's forward."""
        adapters = [s.request.params.lora for s in self._running]
        out = self.forward(adapters, self._kv.cache, input_ids=input_ids, attention_mask=mask, position_ids=positions)
        return out.logits

    def _after_tokens(self, sequences: list[Sequence], drop: bool = True) -> None:
        """Send what is ready, then (``drop``) drop finished sequences from the batch at once."""
        self._delivery.send(self._plan, sequences)
        if drop and any(s.finish_reason is not None for s in self._running):
            finished = [i for i, s in enumerate(self._running) if s.finish_reason is not None]
            self._kv.compact()  # a finished row's keys/values are read out in one piece
            self.prefiller.offer_finished(self._running, self._kv, finished)
            keep = [i for i, s in enumerate(self._running) if s.finish_reason is None]
            self._running = [self._running[i] for i in self._kv.keep(keep)]

    def _group(self, request: EngineRequest) -> Execution:
        return self._group_by_id(request.request_id)

    def _group_by_id(self, request_id: str) -> Execution:
        """The execution state of a running row's request, which is on the scheduler's books."""
        group = self._scheduler.group(request_id)
        if group is None:
            raise RuntimeError(f"running row of unknown request {request_id}")
        return self._runs.of(group)
