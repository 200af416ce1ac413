"""What the engine tells the readiness probe: idle, busy, stalled and failed loops."""

from __future__ import annotations

import threading
import time

import pytest

from python_backend.engine.liveness import health_problem
from python_backend.protocol.errors import ContractError
from tests.fixtures.engine_driver import Driver, make_engine


def test_a_serving_engine_is_healthy_idle_and_busy(tiny_loaded) -> None:
    engine = make_engine(tiny_loaded, max_iter_times=20000)
    driver = Driver(engine, tiny_loaded)
    try:
        idle = engine.health()
        assert idle.running and not idle.busy and idle.failure is None
        assert health_problem(idle) is None
        flag = threading.Event()
        run = driver.submit("go on", temperature=0, max_tokens=20000, ignore_eos=True, cancelled=flag.is_set)
        deadline = time.monotonic() + 10
        while len(run.deltas) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        busy = engine.health()
        assert busy.busy and busy.since_last_pass_s < 5.0 and health_problem(busy) is None
        flag.set()
        run.wait()
    finally:
        engine.stop()
    stopped = engine.health()
    assert not stopped.running
    problem = health_problem(stopped)
    assert problem is not None and problem.status == 503 and problem.code == "engine_stopped"


def test_a_loop_that_stops_making_progress_is_reported_stalled(tiny_loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(tiny_loaded)
    driver = Driver(engine, tiny_loaded)
    release = threading.Event()
    real_step = engine._steps.decode_step

    def stuck_step() -> None:  # a forward pass that never returns (a deadlock in native code)
        release.wait(30)
        real_step()

    monkeypatch.setattr(engine._steps, "decode_step", stuck_step)
    try:
        run = driver.submit("hello", temperature=0, max_tokens=3)
        time.sleep(0.3)
        health = engine.health()
        assert health.running and health.busy and health.since_last_pass_s >= 0.2
        problem = health_problem(health, stall_limit_s=0.1)
        assert problem is not None and problem.code == "engine_stalled"
        assert "no progress for" in problem.message
        release.set()
        run.wait()
        assert health_problem(engine.health(), stall_limit_s=5.0) is None  # moving again
    finally:
        release.set()
        engine.stop()


def test_a_failed_loop_ends_every_request_and_refuses_new_ones(tiny_loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(tiny_loaded, max_num_seqs=1)
    driver = Driver(engine, tiny_loaded)
    armed = threading.Event()
    real_step = engine._steps.decode_step

    def broken_step() -> None:  # a bug outside the per-request guards of prefill and decode
        if armed.is_set():
            raise RuntimeError("bookkeeping bug")
        real_step()

    monkeypatch.setattr(engine._steps, "decode_step", broken_step)
    try:
        runs = [driver.submit(f"r{i}", temperature=0, max_tokens=200, ignore_eos=True) for i in range(3)]
        deadline = time.monotonic() + 10
        while not runs[0].deltas and time.monotonic() < deadline:
            time.sleep(0.005)
        armed.set()
        for run in runs:  # running and queued alike: one final event with the error
            run.wait(10)
            assert sum(e.final for e in run.events) == 1
            assert run.error is not None and (run.error.status, run.error.code) == (503, "engine_failed")
        health = engine.health()
        assert not health.running and health.failure == "RuntimeError: bookkeeping bug"
        problem = health_problem(health)
        assert problem is not None and problem.code == "engine_failed"
        with pytest.raises(ContractError) as refused:
            driver.submit("after", temperature=0, max_tokens=3)
        assert refused.value.info.status == 503 and refused.value.info.code == "engine_failed"
    finally:
        engine.stop()
