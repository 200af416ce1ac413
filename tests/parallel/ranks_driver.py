"""A model served over N CPU ranks the way the Triton model does it, driven without Triton."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_backend.engine.engine import Engine
from python_backend.model.loader import load_model
from python_backend.parallel.ranks import RankGroup
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.engine_driver import Driver


@dataclass
class Served:
    driver: Driver
    engine: Engine
    ranks: RankGroup | None  # None: one rank


@contextmanager
def served(model_dir: Path, ranks: int, **overrides: Any) -> Iterator[Served]:
    """The model on ``ranks`` CPU ranks (float32); every rank process is stopped at the end."""
    settings = EngineSettings(
        model_path=str(model_dir), dtype="float32", device="cpu", tensor_parallel_size=ranks, **overrides
    )
    group = RankGroup.start(settings) if ranks > 1 else None
    try:
        mine = group.settings if group is not None else settings
        loaded = load_model(mine)
        engine = Engine(loaded, mine, ranks=group.sync if group is not None else None)
        engine.start()
        try:
            yield Served(Driver(engine, loaded), engine, group)
        finally:
            engine.stop()
    finally:
        if group is not None:
            group.close()
