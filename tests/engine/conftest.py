"""Engine fixtures: the real engine on the tiny model (float32), driven without Triton."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from python_backend.engine.engine import Engine
from python_backend.model.loader import LoadedModel
from tests.fixtures.engine_driver import Driver, make_engine


@pytest.fixture
def start_engine() -> Iterator[Callable[..., Engine]]:
    """Starts the real engine on a loaded model, with ``make_engine``'s settings and these
    overrides; every engine started so is stopped when the test ends, however it ends."""
    started: list[Engine] = []

    def start(loaded: LoadedModel, **overrides: Any) -> Engine:
        started.append(make_engine(loaded, **overrides))
        return started[-1]

    yield start
    for engine in started:
        engine.stop()


@pytest.fixture
def driver(tiny_loaded: LoadedModel, start_engine: Callable[..., Engine]) -> Driver:
    return Driver(start_engine(tiny_loaded), tiny_loaded)
