"""The engine: one step-loop thread that owns torch and the device, with continuous batching.

Owns: the step loop, the batched decode step (sampling), the mixed step, cancellation, and the
loop's health for the readiness probe (``liveness.py``). What each step does is decided by
``scheduler.py`` (admission, chunking, cache joins, reaping), without torch; the engine executes
its plan: the prefill through ``prefill.py``'s ``Prefiller``, beam search's part through
``beam_steps.py``, new rows from ``rows.py``; what the step's tokens send is ``delivery.py``'s.
Each iteration of the loop: take new requests, drop cancelled ones, then one forward pass with
the planned prompt tokens and every running sequence's next token (the lean CPU step), or the
prefill passes and then the decode step. Requests join and leave between steps; a new request's
prefill never recomputes running ones.

Transport-free: the Triton adapter (``python_backend.triton``) and the tests drive it the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from python_backend.cpu.fast_decode import DecodeRows
from python_backend.engine.admission import Admission
from python_backend.engine.batch_cache import BatchCache
from python_backend.engine.beam_search import BeamSearch
from python_backend.engine.beam_steps import beam_advance
from python_backend.engine.cancel_watch import CancelWatcher, Watched
from python_backend.engine.delivery import Delivery, deliver
from python_backend.engine.kv_cache import KVBatch
from python_backend.engine.limits import Limits
from python_backend.engine.liveness import EngineHealth, EngineStats, Heartbeat
from python_backend.engine.prefill import INTERNAL_ERROR, OpenSegment, Prefilled, Prefiller, PrefillResult
from python_backend.engine.prefix_cache import LayerStates, PrefixCache, PrefixHit
from python_backend.engine.request import EngineEvent, EngineRequest, RequestGroup, rows_needed
from python_backend.engine.rows import new_sequences
from python_backend.engine.scheduler import Scheduler, StepPlan
from python_backend.engine.sequence import Sequence
from python_backend.engine.speculative import DraftPlan, Speculator, StepCalls
from python_backend.engine.step_sync import StepSync
from python_backend.engine.thread_tuner import ComputeTeam, ThreadTuner, TunerPolicy
from python_backend.model.cache_keyword import cache_keyword
from python_backend.model.loader import LoadedModel
from python_backend.model.lora import adapter_names
from python_backend.model.threads import engine_thread_count, pinned_cpus, set_team_size, use_compute_threads
from python_backend.protocol.errors import ContractError, ErrorInfo, engine_failed, invalid, shutting_down
from python_backend.protocol.params import check_vocabulary
from python_backend.protocol.settings import EngineSettings
from python_backend.sampling.sampler import sample, take_rows
from python_backend.text.token_text import TokenTexts

logger = logging.getLogger(__name__)

# An idle loop sleeps until submit(), cancel() or stop() wakes it; the timeout only bounds how
# long a missed wake-up could last, so it can be long and cost nothing when no request comes.
_IDLE_WAIT_S = 0.5
# on_idle waits this long after the last step, so a client sending one request after another
# (closed-loop, one at a time) does not get it between every two of them.
IDLE_HOOK_DELAY_S = 1.0
_SHUTDOWN = shutting_down()
_LOOP_FAILED = engine_failed()


class Engine:
    """The engine: a ``Scheduler`` decides each step, this executes it on the model."""

    def __init__(
        self,
        loaded: LoadedModel,
        settings: EngineSettings,
        compute_cpus: list[int] | None = None,
        after_pass: Callable[[], None] | None = None,
        ranks: StepSync | None = None,
        thread_policy: TunerPolicy | None = None,
        on_idle: Callable[[], object] | None = None,
    ) -> None:
        """``compute_cpus``: where to pin the engine thread's team (default: chosen here, on CPU).
        ``after_pass``: called on the engine thread after each pass that may have sent events
        (cancellations, a prefill, a decode step), so a transport can send them as one burst.
        ``ranks``: this rank's tensor-parallel group (``step_sync.py``); None on one device.
        ``thread_policy``: how the team size is tuned on CPU (``thread_tuner.py``; default policy).
        ``on_idle``: called on the engine thread once each time it has been idle ``IDLE_HOOK_DELAY_S``
        after a step (within one ``_IDLE_WAIT_S`` more)."""
        self._after_pass = after_pass or (lambda: None)
        self._on_idle = on_idle or (lambda: None)
        self._loaded = loaded
        self._settings = settings
        self._ranks = ranks
        self.limits = Limits.resolve(settings, loaded)
        if ranks is not None:
            self.limits = ranks.agree(self.limits)
        self._sample = ranks.sample if ranks is not None else sample
        self._texts = TokenTexts(loaded.tokenizer)
        make_admission = ranks.admission if ranks is not None else Admission
        admission = make_admission(settings.max_waiting_requests, self.limits.kv_budget_tokens)
        self._scheduler = Scheduler(admission, settings.max_num_seqs, settings.max_num_batched_tokens)
        self._delivery = Delivery(self._scheduler, loaded.tokenizer, settings.stream_interval)
        self._running: list[Sequence] = []  # in KV-batch row order
        self._kv = KVBatch(loaded.kv_dtype, settings.max_num_seqs)
        self._prefix = PrefixCache(self.limits.prefix_cache_tokens)
        self._prefiller = Prefiller(loaded, self._prefix)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._heartbeat = Heartbeat()
        self._cache_arg = cache_keyword(loaded.transformers_model)
        self._threads = engine_thread_count(settings.torch_threads)
        on_cpu = loaded.device.type == "cpu"
        bind = settings.cpu_bind_threads
        self._cpus = compute_cpus if compute_cpus is not None else pinned_cpus(self._threads, on_cpu, bind)
        # Under tensor parallel every rank's steps meet in collectives: no rank probes on its own.
        adaptive = settings.cpu_adaptive_threads and on_cpu and self._threads > 1 and ranks is None
        tuner = ThreadTuner(self._threads, policy=thread_policy) if adaptive else None
        self._team = ComputeTeam(self._threads, set_team_size, tuner)
        self._watcher = CancelWatcher(self.cancel)
        # Every rank would have to agree on each row's drafts and accepted count: one device only.
        self._speculator = Speculator.from_settings(settings, loaded.draft) if ranks is None else None
        # Prompt tokens ride in the decode step's pass where the lean CPU step runs; speculation's
        # verify steps (``_mixes_now``) and the batch-invariant kernels keep prefill in passes of its own.
        fast = loaded.fast_decoder
        self._mixes = settings.mixed_prefill and fast is not None and fast.mixes and ranks is None

    # --- public interface (any thread) ----------------------------------------------------------
    def start(self) -> None:
        self._watcher.start()
        self._thread = threading.Thread(target=self._loop, name="triton-chat-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._watcher.stop()

    def reserve(self) -> None:
        """Hold a waiting place for a request that is still being prepared; raise ``ContractError``
        (429) when the queue is full. ``submit(..., reserved=True)`` or ``unreserve`` gives it back."""
        self._refuse_if_stopping()
        self._scheduler.admission.hold()

    def unreserve(self) -> None:
        self._scheduler.admission.unhold()

    def submit(self, request: EngineRequest, reserved: bool = False) -> None:
        """Queue a request; raise ``ContractError`` at once if it can never run or we are full.
        ``reserved``: in the place ``reserve`` held, which a refusal gives back."""
        try:
            self._submit(request, reserved)
        except BaseException:
            if reserved:
                self.unreserve()
            raise

    def _refuse_if_stopping(self) -> None:
        if self._stopping.is_set():
            raise ContractError(_LOOP_FAILED if self._heartbeat.failure else _SHUTDOWN)

    def _submit(self, request: EngineRequest, reserved: bool) -> None:
        self._refuse_if_stopping()
        params = request.params
        if params.use_beam_search and params.logprobs:
            raise invalid("'logprobs' cannot be used with 'use_beam_search'", "logprobs")
        check_vocabulary(params, self._loaded.vocab_size)
        self._prefiller.check_request(request)
        rows = rows_needed(request)
        max_new = self.limits.max_new_tokens(len(request.prompt_ids), params)
        reservation = self.limits.reservation(len(request.prompt_ids), max_new, rows)
        if rows > self._settings.max_num_seqs:
            raise invalid(
                f"n/best_of is {rows}; the server runs at most {self._settings.max_num_seqs} sequences",
                "best_of" if (params.best_of or 0) > params.n else "n",
            )
        self._scheduler.admission.enqueue(RequestGroup(request, max_new, reservation), held=reserved)
        self._wake.set()

    def cancel(self, request_id: str, before_arrival: bool = False) -> None:
        """Cancel at the next step (``before_arrival``: see ``Admission.request_cancel``)."""
        self._scheduler.admission.request_cancel(request_id, before_arrival)
        self._wake.set()

    def stats(self) -> EngineStats:
        return EngineStats(
            len(self._running),
            self._scheduler.admission.queued,
            self._kv.bytes_used(),
            self._scheduler.admission.reserved,
            self.limits.kv_budget_tokens,
            self._prefix.tokens_held,
            self._prefix.bytes_held,
            compute_threads=self._team.threads,
            **(self._speculator.counters.as_stats() if self._speculator is not None else {}),
        )

    def health(self) -> EngineHealth:
        """A snapshot of the step loop for the readiness probe (``liveness.health_problem``)."""
        thread = self._thread
        return EngineHealth(
            running=thread is not None and thread.is_alive() and not self._stopping.is_set(),
            busy=self._scheduler.busy,
            since_last_pass_s=self._heartbeat.since_last_beat(),
            failure=self._heartbeat.failure,
        )

    # --- the loop (engine thread only) -----------------------------------------------------------
    def _loop(self) -> None:
        # OpenMP's team is per thread: size (and on CPU pin) it where the forward passes run.
        use_compute_threads(self._threads, self._cpus)
        # The cache's tensors are inference tensors, so the shutdown path that compacts them
        # (``_fail_all``) must run inside the same mode as the steps.
        with torch.inference_mode():
            self._guarded_loop()

    def _guarded_loop(self) -> None:
        try:
            self._run_steps()
        except Exception as exc:
            # A bug outside the per-request guards of prefill and decode. Every request still gets
            # its final response, new ones are refused, and the probe reports the engine failed,
            # so readiness turns 503 and the launcher restarts the model (supervisor.py).
            logger.exception("the engine loop failed; failing its %d requests", len(self._scheduler.groups))
            self._heartbeat.fail(f"{type(exc).__name__}: {exc}")
            self._stopping.set()
            self._abandon_all(_LOOP_FAILED)
            return
        self._fail_all(_SHUTDOWN)

    def _abandon_all(self, error: ErrorInfo) -> None:
        """End every request with ``error`` without touching the batch state, which may be what broke."""
        for group in self._scheduler.abandon():
            deliver(group.request, EngineEvent(group.request.request_id, error=error, final=True))

    def _run_steps(self) -> None:
        idle_since: float | None = None  # the end of the latest step, until on_idle has run
        while not self._stopping.is_set():
            self._heartbeat.beat()
            if self._ranks is None:
                self._reap_cancelled()
            elif not self._ranks.step(self._reap_cancelled):
                break
            self._after_pass()
            if self._speculator is not None:
                self._speculator.retain(self._running)
            if not (self._scheduler.has_prefill_work or self._running):
                if idle_since is not None and time.monotonic() - idle_since >= IDLE_HOOK_DELAY_S:
                    idle_since = None
                    self._on_idle()
                if self._ranks is None or self._ranks.leads:  # a follower waits in step()
                    self._wake.wait(_IDLE_WAIT_S)
                self._wake.clear()
                continue
            plan, hits = self._plan_step()
            opened = self._prefiller.segments(plan, hits) if self._mixes_now() else None
            if opened:
                self._mixed_step(plan, hits, opened)
            else:
                self._prefill_step(plan, hits)
                self._after_pass()
                with self._team.decode(len(self._running)):
                    self._decode_step()
            self._after_pass()
            idle_since = time.monotonic()  # the end of the latest step

    def _speculates_now(self) -> bool:
        return self._speculator is not None and self._speculator.speculates(len(self._running))

    def _mixes_now(self) -> bool:
        """Whether this step's prompts may ride in its decode pass: not in a step that may verify drafts."""
        return self._mixes and not self._speculates_now()

    def _reap_cancelled(self) -> None:
        """Drop requests cancelled by ``cancel()`` or seen cancelled by the watcher since the last step."""
        for group in self._scheduler.reap():
            tokens = sum(len(s.tokens) for s in group.sequences)
            logger.info("request %s cancelled after %d generated tokens", group.request.request_id, tokens)
            self._drop(group, EngineEvent(group.request.request_id, final=True))
        groups = self._scheduler.groups
        if groups:
            # Checked while the next step runs; seen cancellations arrive through cancel().
            self._watcher.check([Watched(g.request.request_id, g.request.is_cancelled) for g in groups])

    def _remove(self, group: RequestGroup, last: EngineEvent) -> None:
        """Take a request out wherever it is, free its rows and reservation, send its last event."""
        if self._scheduler.discard(group):
            self._drop(group, last)

    def _drop(self, group: RequestGroup, last: EngineEvent) -> None:
        """Free the rows of a request the scheduler has let go, and send its last event."""
        if any(s.request is group.request for s in self._running):
            keep = [i for i, s in enumerate(self._running) if s.request is not group.request]
            self._running = [self._running[i] for i in self._kv.keep(keep)]
        deliver(group.request, last)

    def _fail_all(self, error: ErrorInfo) -> None:
        self._scheduler.take_in()
        for group in self._scheduler.groups:
            self._remove(group, EngineEvent(group.request.request_id, error=error, final=True))

    # --- prefill ---------------------------------------------------------------------------------
    def _forward(self, adapters: list[str | None], cache: BatchCache | None, **inputs: Any) -> Any:
        """One forward pass; with LoRA adapters loaded, each row names its adapter (or the base)."""
        if self._loaded.adapters:
            inputs["adapter_names"] = adapter_names(adapters)
        return self._loaded.model(use_cache=True, **inputs, **{self._cache_arg: cache})

    def _plan_step(self) -> tuple[StepPlan, dict[str, PrefixHit]]:
        """The scheduler's plan for this step, and the prefix-cache hits it was planned with."""
        hits: dict[str, PrefixHit] = {}

        def lookup(group: RequestGroup) -> int | None:
            hit = self._prefiller.lookup(group)
            if hit is None:
                return None
            hits[group.request.request_id] = hit
            return hit.tokens

        return self._scheduler.schedule(len(self._running), lookup), hits

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
                self._remove(entry.group, EngineEvent(entry.group.request.request_id, error=INTERNAL_ERROR, final=True))
            self._fail_running()
            return
        if out.decode is not None:
            self._take_decode_logits(out.decode, started)
        self._join(self._prefiller.close_segments(opened, out.segments))

    def _prefill_step(self, plan: StepPlan, hits: dict[str, PrefixHit]) -> None:
        """Execute the scheduler's prefill plan for this step in passes of its own, in the plan's order."""
        if plan.resumed is not None:
            self._join(self._prefiller.chunk(plan.resumed, None, self._forward))
        for joined in plan.joins:
            self._join_cached(joined.group, hits[joined.group.request.request_id])
        if plan.batch:
            for admitted in plan.batch:
                admitted.group.prefix_hit = hits.get(admitted.group.request.request_id)
            self._join(self._prefiller.batch([a.group for a in plan.batch], self._forward))
        if plan.media is not None:
            self._join(self._prefiller.media(plan.media, self._forward))
        if plan.started is not None:
            hit = hits.get(plan.started.group.request.request_id)
            self._join(self._prefiller.chunk(plan.started, hit, self._forward))

    def _join(self, result: PrefillResult) -> None:
        for group in result.failed:
            self._remove(group, EngineEvent(group.request.request_id, error=INTERNAL_ERROR, final=True))
        for done in result.ready:
            self._start_sequences(done)

    def _join_cached(self, group: RequestGroup, hit: PrefixHit) -> None:
        """A prompt cached up to its last token needs no forward pass of its own: it joins the
        running batch, and the next decode step feeds that last token and samples the first
        output token beside every other row (telemetry: that step's batch size and time)."""
        group.cached_tokens = hit.tokens
        self._add_sequences(group, hit.states)

    def _add_sequences(
        self, group: RequestGroup, states: LayerStates, pad: int = 0, rope_delta: int = 0, own: BatchCache | None = None
    ) -> None:
        """The request's sequences join the running batch with these prompt keys/values; ``own``:
        the prefill's cache holding just them, which an empty batch takes without a copy."""
        group.sequences = new_sequences(self._loaded, group, rope_delta)
        if own is None or group.candidates != 1 or pad or not self._kv.adopt(own):
            self._kv.add_states(states, group.candidates, pad=pad)
        self._running.extend(group.sequences)

    def _start_sequences(self, done: Prefilled) -> None:
        """After its prefill: the request joins the batch and samples its first token."""
        group, logits, request = done.group, done.logits, done.group.request
        states = KVBatch.row_states(done.cache, done.row)
        self._add_sequences(group, states, done.pad, done.rope_delta, own=done.cache)
        if request.params.use_beam_search:
            eos = frozenset() if request.params.ignore_eos else self._loaded.eos_token_ids
            group.beam = BeamSearch(group.candidates, group.max_new_tokens, eos)
            ended = time.perf_counter()
            beam_advance(group, self._kv, logits.expand(group.candidates, -1), None, group.prefill_started, ended, 1)
            self._after_tokens(group.sequences)
            return
        for seq in group.sequences:
            seq.update_suppression()
        sampled = self._sample(logits.expand(group.candidates, -1), [s.sampling for s in group.sequences])
        ended = time.perf_counter()
        for seq, token in zip(group.sequences, sampled, strict=True):
            seq.accept(token, self._texts)
            seq.record(group.prefill_started, ended, group.candidates)
        self._after_tokens(group.sequences)

    # --- decode ----------------------------------------------------------------------------------
    def _decode_step(self) -> None:
        if not self._running:
            return
        if self._speculator is not None and self._speculates_now():
            with_beams = any(self._group(s.request).beam is not None for s in self._running)
            try:
                plan = self._speculator.plan(self._running, with_beams)  # a draft model's passes
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
                out = self._forward(
                    adapters, rows.cache, input_ids=rows.input_ids, attention_mask=mask, position_ids=rows.position_ids
                )
                logits = out.logits[:, -1, :]
        except Exception:
            self._fail_running()
            return
        self._take_decode_logits(logits, started)

    def _decode_rows(self) -> DecodeRows:
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
        logger.exception("decode step failed; stopping the %d running requests", len(self._running))
        for group in {id(s.request): self._group(s.request) for s in self._running}.values():
            self._remove(group, EngineEvent(group.request.request_id, error=INTERNAL_ERROR, final=True))

    def _verify_step(self, plan: DraftPlan) -> None:
        """A decode step that also feeds each row its drafts (``speculative.py``); each token is
        sent as it is accepted, so streams see the same deltas as without speculation."""
        assert self._speculator is not None  # planned only with one (an invariant, not input)
        try:
            calls = StepCalls(self._verify_forward, self._sample, self._texts, partial(self._after_tokens, drop=False))
            self._speculator.step(plan, self._running, self._kv, self._loaded.device, calls)
        except Exception:
            self._fail_running()
            return
        self._after_tokens([])

    def _verify_forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor) -> Any:
        """[rows, width, vocab] logits; the fast decoder takes one token per row, so the model's forward."""
        adapters = [s.request.params.lora for s in self._running]
        out = self._forward(adapters, self._kv.cache, input_ids=input_ids, attention_mask=mask, position_ids=positions)
        return out.logits

    def _after_tokens(self, sequences: list[Sequence], drop: bool = True) -> None:
        """Send what is ready, then (``drop``) drop finished sequences from the batch at once."""
        self._delivery.send(sequences)
        if drop and any(s.finish_reason is not None for s in self._running):
            finished = [i for i, s in enumerate(self._running) if s.finish_reason is not None]
            self._kv.compact()  # a finished row's keys/values are read out in one piece
            self._prefiller.offer_finished(self._running, self._kv, finished)
            keep = [i for i, s in enumerate(self._running) if s.finish_reason is None]
            self._running = [self._running[i] for i in self._kv.keep(keep)]

    def _group(self, request: EngineRequest) -> RequestGroup:
        return self._group_by_id(request.request_id)

    def _group_by_id(self, request_id: str) -> RequestGroup:
        """The group of a running row; every running row's request is on the scheduler's books."""
        group = self._scheduler.group(request_id)
        if group is None:
            raise RuntimeError(f"running row of unknown request {request_id}")
        return group
