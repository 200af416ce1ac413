"""The Triton model starts, watches and stops its ranks: a dead rank fails the probe, none outlives it."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from python_backend.protocol import contract
from python_backend.protocol.errors import ErrorInfo
from tests.adapter.model_driver import Served, chat_request, control_request, error_of, text_of

WORKER_MODULE = "python_backend.parallel.worker"
FAIL_DEADLINE_S = 30.0


def rank_processes() -> list[psutil.Process]:
    """This process's worker ranks."""
    return [p for p in psutil.Process().children() if WORKER_MODULE in " ".join(p.cmdline())]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path) -> Iterator[Served]:
    from tests.fakes import pb_utils

    adapter = pb_utils.install(monkeypatch)
    threads = torch.get_num_threads()  # initialize serializes the calling thread, as in the stub
    values = {"model_path": str(tiny_llama_dir), "device": "cpu", "dtype": "float32", "tensor_parallel_size": "2"}
    config = {
        "model_transaction_policy": {"decoupled": True},
        "parameters": {key: {"string_value": value} for key, value in values.items()},
    }
    model = adapter.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config)})
    one = Served(model)
    yield one
    one.finalize()
    torch.set_num_threads(threads)


def probe(served: Served, request_id: str) -> ErrorInfo | None:
    request = control_request(contract.HEALTH_PROBE, True, request_id)
    served.execute(request)
    return error_of(request.get_response_sender().wait_final()[-1])


def test_a_killed_rank_fails_the_probe_and_no_rank_outlives_the_model(served: Served) -> None:
    ranks = rank_processes()
    assert len(ranks) == 1  # rank 0 is this process
    chat = chat_request("before", parameters={"max_tokens": 8, "temperature": 0})
    served.execute(chat)
    chat.get_response_sender().wait_final()
    assert text_of(chat.get_response_sender())
    assert probe(served, "ready") is None

    os.kill(ranks[0].pid, signal.SIGKILL)
    deadline = time.monotonic() + FAIL_DEADLINE_S
    error = probe(served, "after-kill")
    while (error is None or "rank 1" not in error.message) and time.monotonic() < deadline:
        error = probe(served, "after-kill")
    assert error is not None and (error.status, error.code) == (503, "engine_failed")
    assert error.message == "tensor-parallel rank 1 exited (code -9)"
    late = chat_request("after", parameters={"max_tokens": 8})
    served.execute(late)
    late_error = error_of(late.get_response_sender().wait_final()[-1])
    assert late_error is not None and late_error.status == 503  # refused at once, not left waiting

    served.finalize()
    assert rank_processes() == []


def test_unload_stops_every_rank(served: Served) -> None:
    ranks = rank_processes()
    assert len(ranks) == 1 and ranks[0].is_running()
    served.finalize()
    assert rank_processes() == []
    assert not ranks[0].is_running()
