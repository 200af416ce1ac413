"""Fixtures for the adapter tests: the fake ``triton_python_backend_utils`` and served models.

``serve`` initializes the model on the tiny model folder (with the real engine, unless a test
swaps it) and finalizes it at the end.
"""

from __future__ import annotations

import gc
import json
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.adapter.model_driver import Served
from tests.fakes import pb_utils


@pytest.fixture
def adapter(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``python_backend.triton.model``, imported against the fake module for this test only.

    Without its lifeline thread: pytest is no stub, and its parent is no tritonserver
    (``tests/parallel/test_lifeline.py`` tests the lifeline itself)."""
    module = pb_utils.install(monkeypatch)
    monkeypatch.setattr(module, "end_with_tritonserver", lambda: None)
    return module


@pytest.fixture
def serve(adapter: types.ModuleType, tiny_model_dir: Path) -> Iterator[Callable[..., Served]]:
    """Initialize the model on the tiny model with extra model parameters; finalize at the end."""
    threads = torch.get_num_threads()  # initialize serializes the calling thread, as in the stub
    served: list[Served] = []

    def start(**parameters: str) -> Served:
        values = {"model_path": str(tiny_model_dir), "device": "cpu", "dtype": "float32", **parameters}
        config = {
            "model_transaction_policy": {"decoupled": True},
            "parameters": {key: {"string_value": value} for key, value in values.items()},
        }
        model = adapter.TritonPythonModel()
        model.initialize({"model_config": json.dumps(config)})
        served.append(Served(model))
        return served[-1]

    yield start
    for one in served:
        one.finalize()
    # A stub's process ends after finalize with its start-up objects still frozen; pytest goes on,
    # so the next tests get them back for the collector.
    gc.unfreeze()
    torch.set_num_threads(threads)
