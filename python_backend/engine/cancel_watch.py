"""Asking each request's transport whether it was cancelled, once per engine step, off the step loop.

Owns ``CancelWatcher``. Under Triton, ``is_cancelled()`` is a round trip to the server process
(about 0.15 ms); asked for 16 requests inside the step loop it added 2.4 ms to every step at
concurrency 16. The watcher thread asks instead, while the step loop runs the next forward pass:
after each step the engine hands it the requests then in flight, the watcher asks each one, and
reports the cancelled ones through ``Engine.cancel``, which the step loop applies before its next
step. So every request is still checked once per decode step (a gone client's slot is freed within 200 ms), and a cancellation
takes effect one step after it is seen. If a round of questions outlasts a step, only the latest
set of requests is kept for the next round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Watched:
    request_id: str
    is_cancelled: Callable[[], bool]


class CancelWatcher:
    """One thread that polls ``is_cancelled`` for the requests it was last given."""

    def __init__(self, on_cancelled: Callable[[str], None]) -> None:
        self._on_cancelled = on_cancelled
        self._pending: list[Watched] | None = None
        self._ready = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="triton-chat-cancel-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._ready:
            self._stopping = True
            self._ready.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def check(self, requests: list[Watched]) -> None:
        """Ask about these requests next (replacing a round not yet started)."""
        with self._ready:
            self._pending = requests
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while self._pending is None and not self._stopping:
                    self._ready.wait()
                if self._stopping:
                    return
                requests, self._pending = self._pending or [], None
            for watched in requests:
                if self._asks_cancelled(watched):
                    self._on_cancelled(watched.request_id)

    @staticmethod
    def _asks_cancelled(watched: Watched) -> bool:
        try:
            return watched.is_cancelled()
        except Exception:  # a broken transport cannot deliver anything: treat as cancelled
            logger.exception("is_cancelled() failed for %s", watched.request_id)
            return True
