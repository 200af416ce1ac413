"""Engine fixtures: the real engine on the tiny model (float32), driven without Triton."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from python_backend.model.loader import LoadedModel
from tests.fixtures.engine_driver import Driver, make_engine


@pytest.fixture
def driver(tiny_loaded: LoadedModel) -> Iterator[Driver]:
    engine = make_engine(tiny_loaded)
    yield Driver(engine, tiny_loaded)
    engine.stop()
