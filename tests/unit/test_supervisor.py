"""The launcher's supervisor: restart tritonserver when the model's process dies, a bounded number
of times; stop the frontend when tritonserver exits or restarts are used up."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

from openai_frontend.launcher import supervisor
from openai_frontend.launcher.supervisor import MAX_RESTARTS, Supervisor
from openai_frontend.launcher.tritonserver import TritonServerError, TritonServerProcess


class FakeTriton:
    """Stands in for TritonServerProcess: its stub dies whenever ``kill_stub`` is set."""

    def __init__(self, restart_fails: bool = False) -> None:
        self.stub = 100
        self.restarts = 0
        self.code: int | None = None
        self.restart_fails = restart_fails
        self.pid = 1

    def model_processes(self) -> list[int]:
        return [self.stub] if self.stub else []

    def still_running(self, pids: set[int]) -> set[int]:
        return pids & set(self.model_processes())

    def exit_code(self) -> int | None:
        return self.code

    def log_tail(self) -> str:
        return "(log)"

    def restart(self, repo: Path, env: dict[str, str]) -> None:
        if self.restart_fails:
            raise TritonServerError("cannot start")
        self.restarts += 1
        self.stub = 100 + self.restarts

    def wait_ready(self, timeout: float, model: str | None = None) -> None:
        return None


def run(triton: FakeTriton, crash: Any) -> tuple[Supervisor, list[str]]:
    fatal: list[str] = []
    watcher = Supervisor(cast(TritonServerProcess, triton), Path("/repo"), {}, "m", 5.0, lambda: fatal.append("x"))
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    crash(watcher)
    thread.join(10)
    watcher.stop.set()
    thread.join(5)
    return watcher, fatal


def test_a_dead_stub_restarts_tritonserver_until_the_restarts_are_used_up(monkeypatch: Any) -> None:
    monkeypatch.setattr(supervisor, "WATCH_INTERVAL_S", 0.01)
    triton = FakeTriton()

    def crash_repeatedly(_: Supervisor) -> None:
        for _attempt in range(MAX_RESTARTS + 1):
            before = triton.restarts
            triton.stub = 0  # the model's process died
            deadline = time.monotonic() + 2
            while triton.restarts == before and time.monotonic() < deadline:  # restarted, or given up
                time.sleep(0.01)

    _, fatal = run(triton, crash_repeatedly)
    assert triton.restarts == MAX_RESTARTS  # then the next crash stops the server instead
    assert fatal == ["x"]


def test_tritonserver_exiting_stops_the_frontend(monkeypatch: Any) -> None:
    monkeypatch.setattr(supervisor, "WATCH_INTERVAL_S", 0.01)
    triton = FakeTriton()

    def exit_server(_: Supervisor) -> None:
        triton.code = 3

    _, fatal = run(triton, exit_server)
    assert fatal == ["x"] and triton.restarts == 0


def test_a_failed_restart_stops_the_frontend(monkeypatch: Any) -> None:
    monkeypatch.setattr(supervisor, "WATCH_INTERVAL_S", 0.01)
    triton = FakeTriton(restart_fails=True)

    def crash(_: Supervisor) -> None:
        triton.stub = 0

    _, fatal = run(triton, crash)
    assert fatal == ["x"]
