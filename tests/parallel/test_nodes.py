"""One model over two "nodes" on loopback: rank 0 here, node 1 a headless rank keeper
(``python -m python_backend.parallel.node``) in a process of its own. Node 1's rank joins, the
answers are one rank's, it joins again at rank 0's next start, a node with other settings is
refused by name, a node that never comes is named, a silent node fails the model, and no rank
outlives its keeper."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from python_backend.parallel.group import free_address
from python_backend.parallel.ranks import REMOTE_SILENCE_S, RankGroup
from python_backend.parallel.rendezvous import RendezvousError, interface_toward
from python_backend.protocol.settings import EngineSettings
from tests.parallel.ranks_driver import served

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [("the quick brown fox " * (2 * i + 1)) + f"question {i}?" for i in range(4)]
EXIT_S = 30.0


def _nodes(port: int) -> dict[str, Any]:
    """The two-node settings every rank here gets (the ranks refuse to differ)."""
    return {"nnodes": 2, "master_addr": "127.0.0.1", "master_port": port, "max_iter_times": 4096}


@contextmanager
def _node_one(model_dir: Path, port: int, **overrides: Any) -> Iterator[subprocess.Popen[bytes]]:
    """Node 1's rank keeper; killed (with what it started) at the end whatever happened."""
    settings = EngineSettings(
        model_path=str(model_dir),
        dtype="float32",
        device="cpu",
        tensor_parallel_size=2,
        node_rank=1,
        **_nodes(port),
        **overrides,
    )
    command = [sys.executable, "-m", "python_backend.parallel.node", "--settings", json.dumps(settings.to_parameters())]
    keeper = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        yield keeper
    finally:
        if keeper.poll() is None:
            for child in psutil.Process(keeper.pid).children(recursive=True):
                child.kill()
            keeper.kill()
        keeper.wait()


def _greedy(model_dir: Path, ranks: int, **overrides: Any) -> list[str]:
    with served(model_dir, ranks, **overrides) as model:
        runs = [model.driver.submit(p, temperature=0, max_tokens=10 + 3 * i) for i, p in enumerate(PROMPTS)]
        texts = [run.wait().text() for run in runs]
        assert all(run.error is None for run in runs)
        return texts


def _port() -> int:
    return int(free_address().rpartition(":")[2])


@pytest.fixture(autouse=True)
def _loopback_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test's "nodes" meet on loopback; set here so that the setting is undone after the test.
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")


def test_gloo_finds_the_interface_toward_an_address() -> None:
    assert interface_toward("127.0.0.1") == "lo"


def test_a_model_over_two_nodes_answers_as_one_rank_and_its_node_rejoins(tiny_llama_dir: Path) -> None:
    one = _greedy(tiny_llama_dir, 1, max_iter_times=4096)
    port = _port()
    with _node_one(tiny_llama_dir, port) as keeper:
        first = _greedy(tiny_llama_dir, 2, **_nodes(port))
        # Rank 0's model stopped: node 1's rank ended with it, and its keeper started it again.
        second = _greedy(tiny_llama_dir, 2, **_nodes(port))
        with served(tiny_llama_dir, 2, **_nodes(port)) as model:
            assert model.ranks is not None and model.ranks.problem() is None
            ranks = psutil.Process(keeper.pid).children()
            assert len(ranks) == 1
            keeper.kill()  # node 1 goes away: its rank ends with its keeper
            assert ranks[0].wait(EXIT_S) is not None or not ranks[0].is_running()
            deadline = time.monotonic() + REMOTE_SILENCE_S + 15
            while model.ranks.problem() is None and time.monotonic() < deadline:
                time.sleep(0.25)
            problem = model.ranks.problem()
    assert all(one) and first == one and second == one
    assert problem is not None and problem.code == "engine_failed"
    assert "rank 1 on node 1 has been silent" in problem.message


def test_a_node_that_never_comes_is_named(tiny_llama_dir: Path) -> None:
    port = _port()
    settings = EngineSettings(
        model_path=str(tiny_llama_dir), dtype="float32", device="cpu", tensor_parallel_size=2, **_nodes(port)
    )
    started = time.monotonic()
    with pytest.raises(
        RendezvousError, match=rf"node 1 \(ranks 1-1\) did not join rank 0 at 127.0.0.1:{port} within 2 s"
    ):
        RankGroup.start(settings, join_timeout_s=2)
    assert time.monotonic() - started < 30


def test_a_node_given_other_settings_is_refused_by_name(tiny_llama_dir: Path) -> None:
    port = _port()
    settings = EngineSettings(
        model_path=str(tiny_llama_dir), dtype="float32", device="cpu", tensor_parallel_size=2, **_nodes(port)
    )
    with _node_one(tiny_llama_dir, port, max_num_seqs=3) as keeper:
        with pytest.raises(RendezvousError, match=r"--max-num-seqs '3' here, '\d+' on node 0"):
            RankGroup.start(settings, join_timeout_s=120)
        assert keeper.wait(EXIT_S) == 1  # refused: starting its ranks again cannot help


def test_a_rank_lost_mid_pass_ends_what_rank_zero_held_with_engine_failed(tiny_llama_dir: Path) -> None:
    # A forward pass whose all-reduce loses its peer: the ranks are out of step, so every request
    # rank 0 held ends 503 engine_failed (not a 500 for the rows of that pass), and the engine stops.
    with served(tiny_llama_dir, 2) as model:
        assert model.ranks is not None
        runs = [
            model.driver.submit(f"write forever {i}", temperature=0, max_tokens=4000, ignore_eos=True) for i in range(3)
        ]
        deadline = time.monotonic() + 120
        while not any(run.events for run in runs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(run.events for run in runs), "nothing ran"
        os.kill(model.ranks.pids[0], signal.SIGKILL)
        errors = [run.wait().error for run in runs]
        health = model.engine.health()
    assert [(e.status, e.code) if e is not None else None for e in errors] == [(503, "engine_failed")] * 3
    assert not health.running and health.failure is not None
