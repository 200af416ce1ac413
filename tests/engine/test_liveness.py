"""The readiness probe's rule (``liveness.health_problem``) and the loop's heartbeat."""

from __future__ import annotations

import json

import pytest

from python_backend.engine.liveness import STALL_LIMIT_S, EngineHealth, Heartbeat, health_problem


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_heartbeat_measures_time_since_the_last_pass_and_keeps_the_failure() -> None:
    clock = _Clock()
    beat = Heartbeat(clock)
    clock.now += 2.5
    assert beat.since_last_beat() == pytest.approx(2.5)
    beat.beat()
    assert beat.since_last_beat() == 0.0
    assert beat.failure is None
    beat.fail("RuntimeError: boom")
    assert beat.failure == "RuntimeError: boom"


@pytest.mark.parametrize(
    ("health", "code"),
    [
        (EngineHealth(running=True, busy=False, since_last_pass_s=0.01), None),
        # Idle loops wait for work: a long quiet spell is not a stall.
        (EngineHealth(running=True, busy=False, since_last_pass_s=10 * STALL_LIMIT_S), None),
        (EngineHealth(running=True, busy=True, since_last_pass_s=STALL_LIMIT_S - 1), None),
        (EngineHealth(running=True, busy=True, since_last_pass_s=STALL_LIMIT_S + 1), "engine_stalled"),
        (EngineHealth(running=False, busy=False, since_last_pass_s=0.0), "engine_stopped"),
        (EngineHealth(running=False, busy=False, since_last_pass_s=0.0, failure="KeyError: 3"), "engine_failed"),
    ],
)
def test_health_problem(health: EngineHealth, code: str | None) -> None:
    problem = health_problem(health)
    assert (problem.code if problem is not None else None) == code
    if problem is not None:
        assert problem.status == 503 and problem.type == "service_unavailable"
        assert "KeyError" not in problem.message  # the failure's text stays in the log


def test_the_probe_answer_is_json_with_status_ready() -> None:
    body = json.loads(EngineHealth(running=True, busy=True, since_last_pass_s=0.04).to_json())
    assert body == {"status": "ready", "running": True, "busy": True, "since_last_pass_s": 0.04, "failure": None}
