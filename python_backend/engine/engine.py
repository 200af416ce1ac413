"""The engine: one step-loop thread that owns torch and the device, with continuous batching.

Owns: the step loop, the batched decode step (sampling), cancellation, the loop's health for
the readiness probe (``liveness.py``), and delivering ``EngineEvent``s to each request's sink.
Admission (the bounded FIFO queue, KV reservations) is in ``admission.py``; the prefill half of a
step in ``prefill.py``; beam search's part in ``beam_steps.py``.
Each iteration of the loop: take new requests, drop cancelled ones, prefill within the token
budget, then one decode step for every running sequence. Requests join and leave between steps;
a new request's prefill never recomputes running ones.

Transport-free: the Triton adapter (``python_backend.triton``) and the tests drive it the same way.
"""

from __future__ import annotations

import inspect
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from python_backend.engine.admission import Admission, RequestGroup, rows_needed
from python_backend.engine.beam_search import BeamSearch
from python_backend.engine.beam_steps import BeamSteps
from python_backend.engine.cancel_watch import CancelWatcher, Watched
from python_backend.engine.kv_cache import BatchCache, KVBatch
from python_backend.engine.limits import Limits
from python_backend.engine.liveness import EngineHealth, EngineStats, Heartbeat
from python_backend.engine.prefill import INTERNAL_ERROR, PrefillSteps
from python_backend.engine.prefix_cache import LayerStates, PrefixCache
from python_backend.engine.sequence import EngineEvent, EngineRequest, Sequence
from python_backend.model.loader import LoadedModel
from python_backend.model.lora import adapter_names
from python_backend.model.threads import engine_thread_count, pinned_cpus, use_compute_threads
from python_backend.protocol.errors import ContractError, ErrorInfo, engine_failed, invalid, shutting_down
from python_backend.protocol.settings import EngineSettings
from python_backend.sampling.sampler import RowSampling, sample
from python_backend.sampling.structured import GrammarState
from python_backend.text.detokenizer import IncrementalDetokenizer
from python_backend.text.token_text import TokenTexts

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05
_SHUTDOWN = shutting_down()
_LOOP_FAILED = engine_failed()


class Engine(PrefillSteps, BeamSteps):
    """The engine; its prefill steps are in ``prefill.py``, its beam steps in ``beam_steps.py``
    (they share this state)."""

    def __init__(
        self,
        loaded: LoadedModel,
        settings: EngineSettings,
        compute_cpus: list[int] | None = None,
        after_pass: Callable[[], None] | None = None,
    ) -> None:
        """``compute_cpus``: where to pin the engine thread's team (default: chosen here, on CPU).
        ``after_pass``: called on the engine thread after each pass that may have sent events
        (cancellations, a prefill, a decode step), so a transport can send them as one burst."""
        self._after_pass = after_pass or (lambda: None)
        self._loaded = loaded
        self._settings = settings
        self.limits = Limits.resolve(settings, loaded)
        self._texts = TokenTexts(loaded.tokenizer)
        self._admission = Admission(settings.max_waiting_requests, self.limits.kv_budget_tokens)
        self._prefilling: RequestGroup | None = None
        self._running: list[Sequence] = []  # in KV-batch row order
        self._groups: dict[str, RequestGroup] = {}
        self._kv = KVBatch(loaded.kv_dtype)
        self._prefix = PrefixCache(self.limits.prefix_cache_tokens)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._heartbeat = Heartbeat()
        # transformers 5 renamed `past_key_values` to `cache`; pass whichever this version takes.
        forward_args = inspect.signature(loaded.transformers_model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        self._threads = engine_thread_count(settings.torch_threads)
        on_cpu = loaded.device.type == "cpu"
        bind = settings.cpu_bind_threads
        self._cpus = compute_cpus if compute_cpus is not None else pinned_cpus(self._threads, on_cpu, bind)
        self._watcher = CancelWatcher(self.cancel)

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

    def submit(self, request: EngineRequest) -> None:
        """Queue a request; raise ``ContractError`` at once if it can never run or we are full."""
        if self._stopping.is_set():
            raise ContractError(_LOOP_FAILED if self._heartbeat.failure else _SHUTDOWN)
        params = request.params
        if params.use_beam_search and params.logprobs:
            raise invalid("'logprobs' cannot be used with 'use_beam_search'", "logprobs")
        rows = rows_needed(request)
        max_new = self.limits.max_new_tokens(len(request.prompt_ids), params)
        reservation = self.limits.reservation(len(request.prompt_ids), max_new, rows)
        if rows > self._settings.max_num_seqs:
            raise invalid(
                f"n/best_of is {rows}; the server runs at most {self._settings.max_num_seqs} sequences",
                "best_of" if (params.best_of or 0) > params.n else "n",
            )
        self._admission.enqueue(RequestGroup(request, max_new, reservation))
        self._wake.set()

    def cancel(self, request_id: str, before_arrival: bool = False) -> None:
        """Cancel at the next step (``before_arrival``: see ``Admission.request_cancel``)."""
        self._admission.request_cancel(request_id, before_arrival)
        self._wake.set()

    def stats(self) -> EngineStats:
        return EngineStats(
            len(self._running),
            self._admission.queued,
            self._kv.bytes_used(),
            self._admission.reserved,
            self.limits.kv_budget_tokens,
            self._prefix.tokens_held,
            self._prefix.bytes_held,
        )

    def health(self) -> EngineHealth:
        """A snapshot of the step loop for the readiness probe (``liveness.health_problem``)."""
        thread = self._thread
        return EngineHealth(
            running=thread is not None and thread.is_alive() and not self._stopping.is_set(),
            busy=bool(self._groups) or self._admission.queued > 0,
            since_last_pass_s=self._heartbeat.since_last_beat(),
            failure=self._heartbeat.failure,
        )

    # --- the loop (engine thread only) -----------------------------------------------------------
    def _loop(self) -> None:
        # OpenMP's team is per thread: size (and on CPU pin) it where the forward passes run.
        use_compute_threads(self._threads, self._cpus)
        try:
            self._run_steps()
        except Exception as exc:
            # A bug outside the per-request guards of prefill and decode. Every request still gets
            # its final response, new ones are refused, and the probe reports the engine failed,
            # so readiness turns 503 and the launcher restarts the model (supervisor.py).
            logger.exception("the engine loop failed; failing its %d requests", len(self._groups))
            self._heartbeat.fail(f"{type(exc).__name__}: {exc}")
            self._stopping.set()
            self._abandon_all(_LOOP_FAILED)
            return
        self._fail_all(_SHUTDOWN)

    def _abandon_all(self, error: ErrorInfo) -> None:
        """End every request with ``error`` without touching the batch state, which may be what broke."""
        groups = [*self._groups.values(), *self._admission.drain()]
        self._groups.clear()
        for group in groups:
            self._deliver(group.request, EngineEvent(group.request.request_id, error=error, final=True))

    def _run_steps(self) -> None:
        with torch.inference_mode():
            while not self._stopping.is_set():
                self._heartbeat.beat()
                self._drain_inbox()
                self._reap_cancelled()
                self._after_pass()
                if not (self._admission.waiting or self._prefilling or self._running):
                    self._wake.wait(_IDLE_WAIT_S)
                    self._wake.clear()
                    continue
                self._prefill_step()
                self._after_pass()
                self._decode_step()
                self._after_pass()

    def _drain_inbox(self) -> None:
        for group in self._admission.drain():
            request_id = group.request.request_id
            self._groups[request_id] = group
            if self._admission.cancelled_before_arrival(request_id):
                self._admission.request_cancel(request_id)

    def _reap_cancelled(self) -> None:
        """Drop requests cancelled by ``cancel()`` or seen cancelled by the watcher since the last step."""
        cancelled = self._admission.take_cancelled()
        for request_id in cancelled:
            group = self._groups.get(request_id)
            if group is not None:
                tokens = sum(len(s.tokens) for s in group.sequences)
                logger.info("request %s cancelled after %d generated tokens", request_id, tokens)
                self._remove(group, EngineEvent(request_id, final=True))
        if self._groups:
            # Checked while the next step runs; seen cancellations arrive through cancel().
            self._watcher.check([Watched(rid, g.request.is_cancelled) for rid, g in self._groups.items()])

    def _remove(self, group: RequestGroup, last: EngineEvent) -> None:
        """Take a request out wherever it is, free its rows and reservation, send its last event."""
        request_id = group.request.request_id
        if self._groups.pop(request_id, None) is None:
            return
        self._admission.withdraw(group)
        if self._prefilling is group:
            self._prefilling = None
        if any(s.request is group.request for s in self._running):
            keep = [i for i, s in enumerate(self._running) if s.request is not group.request]
            self._running = [self._running[i] for i in keep]
            self._kv.keep(keep)
        self._deliver(group.request, last)

    def _fail_all(self, error: ErrorInfo) -> None:
        self._drain_inbox()
        for group in list(self._groups.values()):
            self._remove(group, EngineEvent(group.request.request_id, error=error, final=True))

    @staticmethod
    def _deliver(request: EngineRequest, event: EngineEvent) -> None:
        try:
            request.sink(event)
        except Exception:  # one request's broken sink must not stop the batch
            logger.exception("sink failed for %s", request.request_id)

    # --- prefill ---------------------------------------------------------------------------------
    def _forward(self, adapters: list[str | None], cache: BatchCache | None, **inputs: Any) -> Any:
        """One forward pass; with LoRA adapters loaded, each row names its adapter (or the base)."""
        if self._loaded.adapters:
            inputs["adapter_names"] = adapter_names(adapters)
        return self._loaded.model(use_cache=True, **inputs, **{self._cache_arg: cache})

    def _row_sampling(self, group: RequestGroup, index: int) -> RowSampling:
        params = group.request.params
        defaults = self._loaded.defaults
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        generator = torch.Generator(device=self._loaded.device)
        generator.manual_seed((seed + index) % (1 << 64))  # distinct draws for each of n choices
        top_k = params.top_k if params.top_k is not None else defaults.top_k
        return RowSampling(
            temperature=params.temperature if params.temperature is not None else defaults.temperature,
            top_p=params.top_p if params.top_p is not None else defaults.top_p,
            top_k=min(top_k, self._loaded.vocab_size),
            repetition_penalty=params.repetition_penalty,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            generator=generator,
            top_logprobs=params.top_logprobs if params.logprobs else (0 if group.buffered else None),
            prompt_ids=torch.tensor(group.request.prompt_ids, dtype=torch.long),
            grammar=GrammarState(group.request.grammar, self._loaded.vocab_size)
            if group.request.grammar is not None
            else None,
        )

    def _add_sequences(self, group: RequestGroup, states: LayerStates, pad: int = 0, rope_delta: int = 0) -> None:
        """The request's sequences join the running batch with these prompt keys/values."""
        request = group.request
        group.sequences = [
            Sequence(
                index=i,
                request=request,
                sampling=self._row_sampling(group, i),
                detokenizer=IncrementalDetokenizer(
                    self._loaded.tokenizer, request.prompt_ids, request.params.skip_special_tokens
                ),
                max_new_tokens=group.max_new_tokens,
                eos_ids=self._loaded.eos_token_ids,
            )
            for i in range(group.candidates)
        ]
        for seq in group.sequences:
            seq.rope_delta = rope_delta
            seq.cached_tokens = group.cached_tokens
        self._kv.add_states(states, group.candidates, pad=pad)
        self._running.extend(group.sequences)

    def _start_sequences(
        self, group: RequestGroup, logits: torch.Tensor, cache: BatchCache, row: int, pad: int, rope_delta: int = 0
    ) -> None:
        """After its prefill: the request joins the batch and samples its first token."""
        request = group.request
        self._add_sequences(group, KVBatch.row_states(cache, row), pad, rope_delta)
        if request.params.use_beam_search:
            eos = frozenset() if request.params.ignore_eos else self._loaded.eos_token_ids
            group.beam = BeamSearch(group.candidates, group.max_new_tokens, eos)
            ended = time.perf_counter()
            self._beam_advance(group, logits.expand(group.candidates, -1), None, group.prefill_started, ended, 1)
            self._after_tokens(group.sequences)
            return
        for seq in group.sequences:
            seq.update_suppression()
        sampled = sample(logits.expand(group.candidates, -1), [s.sampling for s in group.sequences])
        ended = time.perf_counter()
        for seq, token in zip(group.sequences, sampled, strict=True):
            seq.accept(token, self._texts)
            seq.record(group.prefill_started, ended, group.candidates)
        self._after_tokens(group.sequences)

    # --- decode ----------------------------------------------------------------------------------
    def _decode_step(self) -> None:
        if not self._running:
            return
        device = self._loaded.device
        started = time.perf_counter()
        try:
            input_ids = torch.tensor([[s.next_input] for s in self._running], dtype=torch.long, device=device)
            position_ids = torch.tensor([[s.position] for s in self._running], dtype=torch.long, device=device)
            # Without padding no mask is needed, and transformers then takes its faster path.
            mask = self._kv.attention_mask(1, device) if self._kv.padded else None
            fast = self._loaded.fast_decoder
            if fast is not None:
                logits = fast.logits(input_ids, position_ids, self._kv.cache, mask.bool() if mask is not None else None)
            else:
                adapters = [s.request.params.lora for s in self._running]
                out = self._forward(
                    adapters, self._kv.cache, input_ids=input_ids, attention_mask=mask, position_ids=position_ids
                )
                logits = out.logits[:, -1, :]
            plain: list[int] = []
            beams: dict[str, list[int]] = {}
            for i, seq in enumerate(self._running):
                if self._groups[seq.request.request_id].beam is None:
                    plain.append(i)
                    seq.update_suppression()
                else:
                    beams.setdefault(seq.request.request_id, []).append(i)
            sampled = sample(logits[plain], [self._running[i].sampling for i in plain]) if plain else []
        except Exception:
            logger.exception("decode step failed; stopping the %d running requests", len(self._running))
            for group in {id(s.request): self._groups[s.request.request_id] for s in self._running}.values():
                self._remove(group, EngineEvent(group.request.request_id, error=INTERNAL_ERROR, final=True))
            return
        ended = time.perf_counter()
        batch = len(self._running)
        for i, token in zip(plain, sampled, strict=True):
            self._running[i].accept(token, self._texts)
            self._running[i].record(started, ended, batch)
        for request_id, rows in beams.items():
            self._beam_advance(self._groups[request_id], logits[rows], rows, started, ended, batch)
        self._after_tokens(list(self._running))

    def _after_tokens(self, sequences: list[Sequence]) -> None:
        """Send what is ready, then drop finished sequences from the batch at once."""
        for seq in sequences:
            group = self._groups.get(seq.request.request_id)
            if group is None:
                continue
            if group.beam is not None:
                if seq.finish_reason is not None and group.request.request_id in self._groups:
                    self._send_beams(group)
                continue
            if seq.finish_reason is not None:
                group.finished += 1
            done = group.finished == len(group.sequences)
            if group.buffered:
                if done:
                    self._send_best(group)
                continue
            if not (done or seq.delta_due(group.request.stream, self._settings.stream_interval)):
                continue
            delta = seq.take_delta(len(group.request.prompt_ids))
            if delta is not None or done:
                self._deliver(group.request, EngineEvent(group.request.request_id, delta=delta, final=done))
            if done:
                self._finish_group(group)
        if any(s.finish_reason is not None for s in self._running):
            self._offer_finished([i for i, s in enumerate(self._running) if s.finish_reason is not None])
            keep = [i for i, s in enumerate(self._running) if s.finish_reason is None]
            self._running = [self._running[i] for i in keep]
            self._kv.keep(keep)

    def _send_best(self, group: RequestGroup) -> None:
        ranked = sorted(group.sequences, key=lambda s: s.cumulative_logprob, reverse=True)
        chosen = ranked[: group.request.params.n]
        for index, seq in enumerate(chosen):
            seq.index = index
            delta = seq.take_delta(len(group.request.prompt_ids))
            if delta is not None and not group.request.params.logprobs:
                delta.logprobs = None
            final = index == len(chosen) - 1
            self._deliver(group.request, EngineEvent(group.request.request_id, delta=delta, final=final))
        self._finish_group(group)

    def _finish_group(self, group: RequestGroup) -> None:
        self._groups.pop(group.request.request_id, None)
        self._admission.release(group)
