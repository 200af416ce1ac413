"""Watching tritonserver and the process that runs the model, for ``triton-chat serve``.

Owns ``Supervisor``: a thread that stops the frontend when tritonserver exits on its own (a
frontend without a model is no use), and restarts tritonserver when its Python-backend stub (the
model's process) dies, e.g. killed by the OOM killer or a crash in native code (RELIABILITY C6).
Triton itself neither restarts the stub nor reports the model unready then: new requests would
fail while readiness stayed 200, and streams in flight would hang. Killing the server ends those
streams at once (their gRPC calls fail, the frontend sends the error event), readiness is 503
while it loads again, and the new server listens on the same ports, so the frontend reconnects by
itself. Restarts are bounded: a model that keeps crashing stops the server instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from openai_frontend.launcher.tritonserver import TritonServerError, TritonServerProcess

logger = logging.getLogger("openai_frontend.launcher")

WATCH_INTERVAL_S = 0.25
MAX_RESTARTS = 3  # within RESTART_WINDOW_S
RESTART_WINDOW_S = 600.0


@dataclass
class Supervisor:
    """Watches one started, ready tritonserver until ``stop`` is set; ``on_fatal`` stops the frontend."""

    triton: TritonServerProcess
    repo: Path
    env: dict[str, str]
    model: str
    ready_timeout_s: float
    on_fatal: Callable[[], None]
    stop: threading.Event = field(default_factory=threading.Event)
    restarts: deque[float] = field(default_factory=deque)  # monotonic times of recent restarts

    def run(self) -> None:
        watched = set(self.triton.model_processes())
        while not self.stop.wait(WATCH_INTERVAL_S):
            code = self.triton.exit_code()
            if code is not None:
                logger.error(
                    "tritonserver exited with status %d; stopping. End of its log:\n%s", code, self.triton.log_tail()
                )
                self.on_fatal()
                return
            gone = watched - self.triton.still_running(watched)
            if not gone:
                continue
            pids = ", ".join(map(str, sorted(gone)))
            if not self._may_restart():
                logger.error(
                    "the model's process (pid %s) died again after %d restarts in %.0f s; stopping",
                    pids, MAX_RESTARTS, RESTART_WINDOW_S,
                )  # fmt: skip
                self.on_fatal()
                return
            logger.error("the model's process (pid %s) died; restarting tritonserver", pids)
            try:
                self._restart()
            except TritonServerError as exc:
                logger.error("tritonserver could not be restarted; stopping: %s", exc)
                self.on_fatal()
                return
            if self.stop.is_set():
                return
            watched = set(self.triton.model_processes())
            logger.info("tritonserver restarted (pid %s); the model is ready again", self.triton.pid)

    def _may_restart(self) -> bool:
        now = time.monotonic()
        while self.restarts and now - self.restarts[0] > RESTART_WINDOW_S:
            self.restarts.popleft()
        if len(self.restarts) >= MAX_RESTARTS:
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

