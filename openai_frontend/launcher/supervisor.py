"""Watching tritonserver and the process that runs the model, for ``triton-chat serve``.

Owns ``Supervisor``: a thread that restarts tritonserver when the model stops serving, which it
notices three ways:

- the Python-backend stub (the model's process) died, e.g. killed by the OOM killer or a crash in
  native code. Triton neither restarts it nor reports the model unready then: new requests would
  fail while readiness stayed 200, and streams in flight would hang;
- tritonserver itself exited (Triton's Python backend aborts the server when a stub it lost
  contact with comes back, for one);
- the model has not answered the health probe (``contract.HEALTH_PROBE``) for ``HANG_RESTART_S``:
  a hung stub, or an engine loop that stalled or died. The frontend's readiness already says 503
  from the first failed probe; this is the recovery.

It also keeps tritonserver's log under its size limit (``LogRotation``, ``--triton-log-max-mb``),
looking at it every tick: a model that logs a traceback per bad request must not fill the disk.

It also stops tritonserver at once (``DEADLINE_STOP_S``) when the frontend's drain has run out of
time: the requests still in flight are being cut anyway, and a graceful stop of the model takes
seconds (the stub's interpreter teardown after ``finalize``), which the exit would wait for.

Killing the server ends the streams in flight at once (their gRPC calls fail, the frontend sends
the error event), readiness is 503 while it loads again, and the new server listens on the same
ports, so the frontend reconnects by itself. Restarts are bounded: a model that keeps failing
stops the launcher (exit 1) instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from openai_frontend.launcher.log_rotation import LogRotation
from openai_frontend.launcher.tritonserver import TritonServerError, TritonServerProcess

logger = logging.getLogger("openai_frontend.launcher")

WATCH_INTERVAL_S = 0.25
PROBE_INTERVAL_S = 5.0
# Probes failing for this long mean the model will not come back by itself. Longer than any
# burst of load can delay a probe, short enough that a stuck server does not sit unready for long.
HANG_RESTART_S = 30.0
# SIGTERM, then SIGKILL after this long, once the drain deadline has passed: no grace, what
# was in flight has been cut and the graceful unload would only delay the exit.
DEADLINE_STOP_S = 0.0
MAX_RESTARTS = 3  # the default of `--max-restarts`: within RESTART_WINDOW_S
RESTART_WINDOW_S = 600.0


class Drain(Protocol):
    """What the supervisor reads of the frontend's drain (``openai_frontend.http.drain``)."""

    draining: bool

    def expired(self) -> bool: ...

    def done(self) -> bool: ...


@dataclass
class Supervisor:
    """Watches one started, ready tritonserver until ``stop`` is set; ``on_fatal`` stops the frontend."""

    triton: TritonServerProcess
    repo: Path
    env: dict[str, str]
    model: str
    ready_timeout_s: float
    on_fatal: Callable[[], None]
    max_restarts: int = MAX_RESTARTS  # within RESTART_WINDOW_S (`--max-restarts`)
    stop: threading.Event = field(default_factory=threading.Event)
    drain: Drain | None = None  # the frontend's drain, once it has one
    restarts: deque[float] = field(default_factory=deque)  # monotonic times of recent restarts
    log_rotation: LogRotation | None = None  # tritonserver's log, kept under its size

    def run(self) -> None:
        watched = set(self.triton.model_processes())
        hang = _HangClock()
        next_probe = time.monotonic() + PROBE_INTERVAL_S
        while True:
            stopping = self.stop.wait(WATCH_INTERVAL_S)
            # Asked also when told to stop: the frontend exits within a tick of the deadline,
            # often before this loop's next look, and the graceful stop would then hold the exit.
            if self._drain_cut():
                logger.info("drain deadline passed: stopping tritonserver now")
                self.triton.stop(timeout=DEADLINE_STOP_S)
                return
            if stopping:
                return
            self._rotate_log()
            draining = self.drain is not None and self.drain.draining
            reason = self._lost(watched)
            # No probes while draining: readiness is 503 already, and a probe (up to its
            # timeout) would delay seeing the deadline.
            if reason is None and not draining and time.monotonic() >= next_probe:
                reason = hang.observe(self.triton.probe_model(self.model), time.monotonic())
                next_probe = time.monotonic() + PROBE_INTERVAL_S
            if reason is None:
                continue
            if not self._recover(reason):
                self.on_fatal()
                return
            if self.stop.is_set():
                return
            watched = set(self.triton.model_processes())
            hang = _HangClock()
            next_probe = time.monotonic() + PROBE_INTERVAL_S
            logger.info("tritonserver restarted (pid %s); the model is ready again", self.triton.pid)

    def _rotate_log(self) -> None:
        if self.log_rotation is None:
            return
        try:
            self.log_rotation.check()
        except OSError as exc:
            # A full disk or a removed folder: say so once and stop rotating, but keep watching.
            logger.warning("cannot rotate tritonserver's log %s any more: %s", self.log_rotation.path, exc)
            self.log_rotation = None

    def _drain_cut(self) -> bool:
        """The drain's deadline has passed and the frontend is done waiting for what it cut."""
        return self.drain is not None and self.drain.draining and self.drain.expired() and self.drain.done()

    def _lost(self, watched: set[int]) -> str | None:
        """Why the server must be restarted now, if its process or the model's is gone."""
        code = self.triton.exit_code()
        gone = watched - self.triton.still_running(watched)
        stub = f"the model's process (pid {', '.join(map(str, sorted(gone)))}) died" if gone else None
        if code is None:
            return stub
        # Triton's Python backend may abort the server when a stub dies holding a shared-memory
        # lock; the dead stub is then the cause to name, whichever the watch saw first.
        server = f"tritonserver exited with status {code}. End of its log:\n{self.triton.log_tail()}"
        return server if stub is None else f"{stub} and {server}"

    def _recover(self, reason: str) -> bool:
        """Restart tritonserver for ``reason``; False when the restarts are used up or it fails."""
        if not self._may_restart():
            logger.error("%s, after %d restarts in %.0f s; stopping", reason, self.max_restarts, RESTART_WINDOW_S)
            return False
        logger.error("%s; restarting tritonserver", reason)
        try:
            self._restart()
        except TritonServerError as exc:
            logger.error("tritonserver could not be restarted; stopping: %s", exc)
            return False
        return True

    def _may_restart(self) -> bool:
        now = time.monotonic()
        while self.restarts and now - self.restarts[0] > RESTART_WINDOW_S:
            self.restarts.popleft()
        if len(self.restarts) >= self.max_restarts:
            return False
        self.restarts.append(now)
        return True

    def _restart(self) -> None:
        self.triton.restart(self.repo, self.env)
        deadline = time.monotonic() + self.ready_timeout_s
        # Waited for in short steps so that a shutdown meanwhile is not held up by the load.
        while not self.stop.is_set():
            try:
                self.triton.wait_ready(min(1.0, max(deadline - time.monotonic(), 0.0)), self.model)
                return
            except TritonServerError:
                if self.triton.exit_code() is not None or time.monotonic() >= deadline:
                    raise


@dataclass
class _HangClock:
    """How long the health probe has been failing without a break."""

    failing_since: float | None = None

    def observe(self, problem: str | None, now: float) -> str | None:
        """Record one probe's result; the restart reason once it has failed for ``HANG_RESTART_S``."""
        if problem is None:
            if self.failing_since is not None:
                logger.info("the model answers its health probe again")
            self.failing_since = None
            return None
        if self.failing_since is None:
            self.failing_since = now
            logger.warning("the model did not answer its health probe: %s", problem)
        if now - self.failing_since < HANG_RESTART_S:
            return None
        return f"the model has not answered its health probe for {now - self.failing_since:.0f} s ({problem})"
