"""The engine: one step-loop thread that owns torch and the device, with continuous batching.

Owns: the public interface (submit, reserve, cancel, stats, health; any thread), the step loop,
cancellation and the loop's health for the readiness probe (``liveness.py``). What each step
does is decided by ``scheduler.py`` (admission, chunking, cache joins, reaping), without torch,
and executed by ``steps.py``'s ``StepRunner`` (the running batch, prefill, decode, sampling),
which reports each pass back to the scheduler (``Scheduler.update``: which requests run and which
are finished). Requests come in through ``python_backend.intake``.
Each iteration of the loop: take new requests, drop cancelled ones, then one step. Requests join
and leave between steps; a new request's prefill never recomputes running ones.

Transport-free: the Triton adapter (``python_backend.triton``) and the tests drive it the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from python_backend.engine.admission import Admission
from python_backend.engine.cancel_watch import CancelWatcher, Watched
from python_backend.engine.delivery import deliver
from python_backend.engine.limits import Limits
from python_backend.engine.liveness import EngineHealth, EngineStats, Heartbeat
from python_backend.engine.request import EngineEvent, EngineRequest, RequestGroup, rows_needed
from python_backend.engine.scheduler import Scheduler
from python_backend.engine.step_sync import StepSync
from python_backend.engine.steps import StepRunner
from python_backend.engine.thread_tuner import ComputeTeam, ThreadTuner, TunerPolicy
from python_backend.model.loader import LoadedModel
from python_backend.model.threads import engine_thread_count, pinned_cpus, set_team_size, use_compute_threads
from python_backend.protocol.errors import ContractError, ErrorInfo, engine_failed, invalid, shutting_down
from python_backend.protocol.params import check_vocabulary
from python_backend.protocol.settings import EngineSettings

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
        make_admission = ranks.admission if ranks is not None else Admission
        admission = make_admission(settings.max_waiting_requests, self.limits.kv_budget_tokens)
        self._scheduler = Scheduler(admission, settings.max_num_seqs, settings.max_num_batched_tokens)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._heartbeat = Heartbeat()
        self._threads = engine_thread_count(settings.torch_threads)
        on_cpu = loaded.device.type == "cpu"
        bind = settings.cpu_bind_threads
        self._cpus = compute_cpus if compute_cpus is not None else pinned_cpus(self._threads, on_cpu, bind)
        # Under tensor parallel every rank's steps meet in collectives: no rank probes on its own.
        adaptive = settings.cpu_adaptive_threads and on_cpu and self._threads > 1 and ranks is None
        tuner = ThreadTuner(self._threads, policy=thread_policy) if adaptive else None
        self._team = ComputeTeam(self._threads, set_team_size, tuner)
        self._watcher = CancelWatcher(self.cancel)
        self._steps = StepRunner(loaded, settings, self.limits, self._scheduler, self._team, ranks)

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
        self._steps.prefiller.check_request(request)
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
        speculator = self._steps.speculator
        return EngineStats(
            self._steps.running_rows,
            self._scheduler.admission.queued,
            self._steps.kv_bytes,
            self._scheduler.admission.reserved,
            self.limits.kv_budget_tokens,
            self._steps.prefix.tokens_held,
            self._steps.prefix.bytes_held,
            compute_threads=self._team.threads,
            **(speculator.counters.as_stats() if speculator is not None else {}),
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
            self._steps.retain()
            if not self._steps.has_work:
                if idle_since is not None and time.monotonic() - idle_since >= IDLE_HOOK_DELAY_S:
                    idle_since = None
                    self._on_idle()
                if self._ranks is None or self._ranks.leads:  # a follower waits in step()
                    self._wake.wait(_IDLE_WAIT_S)
                self._wake.clear()
                continue
            self._steps.step(self._after_pass)
            self._after_pass()
            idle_since = time.monotonic()  # the end of the latest step

    def _reap_cancelled(self) -> None:
        """Drop requests cancelled by ``cancel()`` or seen cancelled by the watcher since the last step."""
        for group in self._scheduler.reap():
            tokens = self._steps.generated_tokens(group)
            logger.info("request %s cancelled after %d generated tokens", group.request.request_id, tokens)
            self._steps.drop(group, EngineEvent(group.request.request_id, final=True))
        groups = self._scheduler.groups
        if groups:
            # Checked while the next step runs; seen cancellations arrive through cancel().
            self._watcher.check([Watched(g.request.request_id, g.request.is_cancelled) for g in groups])

    def _fail_all(self, error: ErrorInfo) -> None:
        self._scheduler.take_in()
        for group in self._scheduler.groups:
            self._steps.remove(group, EngineEvent(group.request.request_id, error=error, final=True))
