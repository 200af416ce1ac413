"""A stand-in for ``Engine`` in the adapter: it records submissions and reports a set health.

For adapter tests where the engine's own work does not matter: what the model answers when the
engine refuses a request in an unexpected way, or reports itself stalled. A test puts it in
place of ``Engine`` with ``monkeypatch.setattr(adapter, "Engine", fake.build)``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from python_backend.engine.liveness import EngineHealth, EngineStats
from python_backend.engine.sequence import EngineRequest


@dataclass
class FakeEngine:
    """``Engine``'s interface as the adapter uses it."""

    health_report: EngineHealth = field(default_factory=lambda: EngineHealth(True, False, 0.0))
    submit_error: Exception | None = None  # raised by submit, as a bug would be
    submitted: list[EngineRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    started: bool = False
    stopped: bool = False
    reserved: int = 0  # waiting places held for requests still being prepared
    _arrived: threading.Condition = field(default_factory=threading.Condition)

    def build(self, *args: Any, **kwargs: Any) -> FakeEngine:
        """Called as ``Engine(loaded, settings, ...)`` would be: this engine, whatever the args."""
        return self

    def start(self) -> None:
        self.started = True

    def stop(self, timeout: float = 30.0) -> None:
        self.stopped = True

    def reserve(self) -> None:
        self.reserved += 1

    def unreserve(self) -> None:
        self.reserved -= 1

    def submit(self, request: EngineRequest, reserved: bool = False) -> None:
        if reserved:
            self.reserved -= 1  # taken, or given back by the refusal
        if self.submit_error is not None:
            raise self.submit_error
        with self._arrived:
            self.submitted.append(request)
            self._arrived.notify_all()

    def wait_submitted(self, count: int, timeout: float = 30.0) -> list[EngineRequest]:
        """The first ``count`` submissions, once made (requests are prepared on their own thread)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.submitted) >= count, timeout):
                raise TimeoutError(f"{len(self.submitted)} of {count} requests were submitted")
            return self.submitted[:count]

    def cancel(self, request_id: str, before_arrival: bool = False) -> None:
        self.cancelled.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0, 0, 0)

    def health(self) -> EngineHealth:
        return self.health_report
