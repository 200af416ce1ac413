"""The launcher's supervisor: restart tritonserver when the model's process dies, when the server
exits, or when the model stops answering its health probe, a bounded number of times; stop the
frontend when the restarts are used up or a restart fails."""

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
        self.problem: str | None = None  # what the health probe answers (None: healthy)
        self.probes = 0

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
        self.code = None
        self.problem = None

    def wait_ready(self, timeout: float, model: str | None = None) -> None:
        return None

    def probe_model(self, model: str) -> str | None:
        self.probes += 1
        return self.problem


def start(triton: FakeTriton, fatal: list[str], **options: Any) -> tuple[Supervisor, threading.Thread]:
    """A supervisor of ``triton`` watching on its own thread; each fatal stop appends to ``fatal``."""
    watcher = Supervisor(
        cast(TritonServerProcess, triton), Path("/repo"), {}, "m", 5.0, lambda: fatal.append("x"), **options
    )
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    return watcher, thread


def run(triton: FakeTriton, crash: Any, gives_up: bool = True) -> tuple[Supervisor, list[str]]:
    """Run a supervisor through ``crash``; wait for it to give up by itself when ``gives_up``."""
    fatal: list[str] = []
    watcher, thread = start(triton, fatal)
    crash(watcher)
    if gives_up:
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


def test_tritonserver_exiting_on_its_own_is_restarted(monkeypatch: Any) -> None:
    monkeypatch.setattr(supervisor, "WATCH_INTERVAL_S", 0.01)
    triton = FakeTriton()

    def exit_server(_: Supervisor) -> None:
        triton.code = -6  # Triton's Python backend aborts the server in some stub failures
        _wait_for(lambda: triton.restarts == 1)

    _, fatal = run(triton, exit_server, gives_up=False)
    assert fatal == [] and triton.restarts == 1


def test_a_stub_that_died_is_named_when_tritonserver_aborted_with_it(monkeypatch: Any, caplog: Any) -> None:
    monkeypatch.setattr(supervisor, "WATCH_INTERVAL_S", 0.01)
    triton = FakeTriton()
    caplog.set_level("ERROR", logger="openai_frontend.launcher")

    def crash_both(_: Supervisor) -> None:
        triton.stub, triton.code = 0, -6  # the stub segfaulted and the server aborted on its lock
        _wait_for(lambda: triton.restarts == 1)

    _, fatal = run(triton, crash_both, gives_up=False)
    assert fatal == [] and triton.restarts == 1
    said = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("the model's process (pid 100) died and tritonserver exited with status -6") for m in said
    ), said


def probed(monkeypatch: Any, hang_restart_s: float) -> FakeTriton:
    """A server whose model the supervisor probes every 20 ms, restarting it after ``hang_restart_s``
    without an answer."""
    monkeypatch.setattr(supervisor, "WATCH_INTERVAL_S", 0.01)
    monkeypatch.setattr(supervisor, "PROBE_INTERVAL_S", 0.02)
    monkeypatch.setattr(supervisor, "HANG_RESTART_S", hang_restart_s)
    return FakeTriton()


def test_a_model_that_stops_answering_its_probe_is_restarted(monkeypatch: Any) -> None:
    triton = probed(monkeypatch, hang_restart_s=0.3)

    def hang(_: Supervisor) -> None:
        triton.problem = "no answer within 2 s"  # the stub is stopped: it exists but never answers
        started = time.monotonic()
        _wait_for(lambda: triton.restarts == 1)
        assert time.monotonic() - started >= 0.3

    _, fatal = run(triton, hang, gives_up=False)
    assert fatal == [] and triton.restarts == 1


def test_a_probe_that_fails_briefly_restarts_nothing(monkeypatch: Any) -> None:
    triton = probed(monkeypatch, hang_restart_s=0.5)

    def blip(_: Supervisor) -> None:
        for _round in range(3):  # each failure shorter than HANG_RESTART_S, then an answer
            triton.problem = "HTTP 400: Stub process 'triton_chat_0_0' is not healthy."
            time.sleep(0.25)
            triton.problem = None
            _wait_for(lambda: triton.probes >= 1)
            time.sleep(0.1)

    _, fatal = run(triton, blip, gives_up=False)
    assert fatal == [] and triton.restarts == 0


def _wait_for(condition: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_failed_restart_stops_the_frontend(monkeypatch: Any) -> None:
    monkeypatch.setattr(supervisor, "WATCH_INTERVAL_S", 0.01)
    triton = FakeTriton(restart_fails=True)

    def crash(_: Supervisor) -> None:
        triton.stub = 0

    _, fatal = run(triton, crash)
    assert fatal == ["x"]


def test_max_restarts_zero_stops_at_the_first_failure(monkeypatch: Any) -> None:
    monkeypatch.setattr(supervisor, "WATCH_INTERVAL_S", 0.01)
    triton = FakeTriton()
    fatal: list[str] = []
    _, thread = start(triton, fatal, max_restarts=0)
    triton.stub = 0
    thread.join(5)
    assert fatal == ["x"] and triton.restarts == 0


def test_once_the_drain_deadline_has_passed_tritonserver_is_stopped_at_once() -> None:
    triton = _StoppableTriton()
    drain = _OverDrain(over=False)
    fatal: list[str] = []
    _, thread = start(triton, fatal, drain=drain)
    time.sleep(supervisor.WATCH_INTERVAL_S * 2)
    assert triton.stop_timeouts == [] and triton.probes == 0  # draining within the deadline: no probes
    drain.over = True
    thread.join(5)
    assert not thread.is_alive()
    assert triton.stop_timeouts == [supervisor.DEADLINE_STOP_S] and triton.restarts == 0 and fatal == []


class _StoppableTriton(FakeTriton):
    def __init__(self) -> None:
        super().__init__()
        self.stop_timeouts: list[float] = []

    def stop(self, timeout: float = 30.0) -> int | None:
        self.stop_timeouts.append(timeout)
        self.stub, self.code = 0, -9
        return -9


class _OverDrain:
    """A drain whose deadline passed and whose frontend finished waiting (``over``), or not yet."""

    draining = True

    def __init__(self, over: bool) -> None:
        self.over = over

    def expired(self) -> bool:
        return self.over

    def done(self) -> bool:
        return self.over


def _stopped_before_its_next_look(monkeypatch: Any, drain: _OverDrain) -> _StoppableTriton:
    """Tell a supervisor to stop before its watch interval runs out; what it did to tritonserver."""
    monkeypatch.setattr(supervisor, "WATCH_INTERVAL_S", 600.0)
    triton = _StoppableTriton()
    watcher, thread = start(triton, [], drain=drain)
    watcher.stop.set()
    thread.join(5)
    assert not thread.is_alive()
    return triton


def test_a_frontend_that_exits_at_the_deadline_still_gets_tritonserver_stopped_at_once(monkeypatch: Any) -> None:
    # The frontend stops within a tick of the deadline, usually before the supervisor's next look:
    # being told to stop then must not turn the stop into the graceful one (seconds of unload).
    triton = _stopped_before_its_next_look(monkeypatch, _OverDrain(over=True))
    assert triton.stop_timeouts == [supervisor.DEADLINE_STOP_S]


def test_a_drain_that_finished_in_time_leaves_the_graceful_stop_to_the_launcher(monkeypatch: Any) -> None:
    triton = _stopped_before_its_next_look(monkeypatch, _OverDrain(over=False))
    assert triton.stop_timeouts == []
