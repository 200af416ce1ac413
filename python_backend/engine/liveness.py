"""What the engine says about itself: whether it is serving (the readiness probe), and its gauges.

Owns ``Heartbeat`` (the step loop marks each pass, and records why it stopped if it died),
``EngineHealth`` (a snapshot any thread may take), ``health_problem``, the one rule that turns
a snapshot into "ready" or a 503 that says why, and ``EngineStats`` (the gauges' snapshot).

Why a probe at all: Triton reports a model READY for as long as it is loaded. A model process that
hangs (SIGSTOP, a deadlock in native code) or an engine loop that died left readiness at 200 while
every request waited for its timeout (vLLM #39863, Triton #7230). The probe is an
inference request the model answers at once, without entering the batch, so it costs nothing
under load and still proves that the model process, its sender thread and the step loop move.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from python_backend.protocol.errors import ErrorInfo, engine_failed, engine_stalled, engine_stopped

# A busy loop that has not finished a pass for this long is stuck. A pass is one prefill chunk of
# at most max_num_batched_tokens plus one decode step: seconds on a CPU, never minutes.
STALL_LIMIT_S = 60.0


@dataclass
class EngineStats:
    running_sequences: int
    waiting_requests: int
    kv_cache_bytes: int
    kv_reserved_tokens: int
    kv_budget_tokens: int
    prefix_cache_tokens: int = 0  # token positions held by the prefix cache
    prefix_cache_bytes: int = 0
    # Speculative decoding since the engine started, as vLLM names its counters.
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_steps: int = 0
    compute_threads: int = 0  # the engine thread's OpenMP team size now (thread_tuner.py)


@dataclass(frozen=True)
class EngineHealth:
    """A snapshot of the step loop, as the probe reports it."""

    running: bool  # the loop thread is alive and has not been stopped
    busy: bool  # it has requests (running, prefilling or queued)
    since_last_pass_s: float  # seconds since the loop last finished a pass
    failure: str | None = None  # why the loop died, when it did

    def to_json(self) -> str:
        return json.dumps({"status": "ready", **asdict(self)})


class Heartbeat:
    """The step loop's sign of life; written by the loop, read by any thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()
        self._failure: str | None = None
        self._lock = threading.Lock()

    def beat(self) -> None:
        self._last = self._clock()  # one float store: no lock needed on the hot path

    def fail(self, reason: str) -> None:
        with self._lock:
            self._failure = reason

    @property
    def failure(self) -> str | None:
        with self._lock:
            return self._failure

    def since_last_beat(self) -> float:
        return max(self._clock() - self._last, 0.0)


def health_problem(health: EngineHealth, stall_limit_s: float = STALL_LIMIT_S) -> ErrorInfo | None:
    """None when the engine serves; otherwise the 503 the probe answers with."""
    if health.failure is not None:
        return engine_failed()
    if not health.running:
        return engine_stopped()
    if health.busy and health.since_last_pass_s > stall_limit_s:
        return engine_stalled(health.since_last_pass_s)
    return None
