"""Engine fixtures: the real engine on the tiny model (float32), driven without Triton."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_driver import Driver, make_engine

from python_backend.model.loader import LoadedModel, load_model
from python_backend.protocol.settings import EngineSettings


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineSettings(model_path=str(tiny_model_dir), dtype="float32", device="cpu"))


@pytest.fixture
def driver(tiny_loaded: LoadedModel) -> Iterator[Driver]:
    engine = make_engine(tiny_loaded)
    yield Driver(engine, tiny_loaded)
    engine.stop()
