"""The engine's idle hook (where the model's process gives its freed heap back) runs once each
time the engine has been idle for ``IDLE_HOOK_DELAY_S``, never again while it stays idle."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from python_backend.engine.engine import IDLE_HOOK_DELAY_S, Engine
from python_backend.model.loader import LoadedModel
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.device import engine_test_device
from tests.fixtures.engine_driver import DEADLINE_S, Driver


class Hooks:
    def __init__(self) -> None:
        self.idle_calls: list[int] = []  # running sequences seen by each call
        self.idle_at: list[float] = []
        self.passes = 0
        self.last_busy_pass = 0.0  # a pass seen with sequences running
        self.changed = threading.Condition()
        self.engine: Engine | None = None

    def on_idle(self) -> None:
        assert self.engine is not None
        with self.changed:
            self.idle_calls.append(self.engine.stats().running_sequences)
            self.idle_at.append(time.monotonic())
            self.changed.notify_all()

    def after_pass(self) -> None:
        assert self.engine is not None
        with self.changed:
            if self.engine.stats().running_sequences:
                self.last_busy_pass = time.monotonic()
            self.passes += 1
            self.changed.notify_all()

    def wait_for(self, what: str, done: object) -> None:
        with self.changed:
            if not self.changed.wait_for(done, timeout=DEADLINE_S):  # type: ignore[arg-type]
                raise TimeoutError(what)


@pytest.fixture
def hooked(tiny_loaded: LoadedModel) -> Iterator[tuple[Driver, Hooks]]:
    hooks = Hooks()
    settings = EngineSettings(model_path="unused", dtype="float32", device=engine_test_device(), max_iter_times=64)
    engine = Engine(tiny_loaded, settings, after_pass=hooks.after_pass, on_idle=hooks.on_idle)
    hooks.engine = engine
    engine.start()
    yield Driver(engine, tiny_loaded), hooks
    engine.stop()


def test_idle_hook_runs_once_per_burst_after_the_last_request(hooked: tuple[Driver, Hooks]) -> None:
    driver, hooks = hooked
    assert hooks.idle_calls == []  # an engine that never worked has nothing to give back

    first = [driver.submit(f"burst one, request {i}", max_tokens=6) for i in range(3)]
    for out in first:
        assert out.wait().error is None
    hooks.wait_for("the engine did not go idle", lambda: len(hooks.idle_calls) == 1)
    assert hooks.idle_calls == [0]
    # Not between two requests of a client sending one after another: only after the delay.
    assert hooks.idle_at[0] - hooks.last_busy_pass >= IDLE_HOOK_DELAY_S

    # Idle passes (woken by cancellations of unknown ids) do not call it again.
    seen = hooks.passes
    for i in range(5):
        driver.engine.cancel(f"no-such-request-{i}")
        hooks.wait_for("the idle engine did not pass", lambda at=seen + i + 1: hooks.passes >= at)  # type: ignore[misc]
    assert hooks.idle_calls == [0]

    assert driver.submit("burst two", max_tokens=4).wait().error is None
    hooks.wait_for("the engine did not go idle again", lambda: len(hooks.idle_calls) == 2)
    assert hooks.idle_calls == [0, 0]
