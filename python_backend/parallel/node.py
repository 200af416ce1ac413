"""One node's ranks as processes: starting and ending worker ranks, and the headless node's loop.

Owns ``RankPlan`` (what one rank needs to join), ``spawn_rank`` (a worker rank's process, ``python
-m python_backend.parallel.worker``), ``end_ranks`` (ask, wait, then kill), and ``run_node``: a
node other than node 0 (``triton-chat worker``, ``python -m python_backend.parallel.node``) starts
its ranks, which join rank 0's rendezvous; when one of them ends (rank 0's model stopped, failed
or is restarting) it ends the others and starts them again, to join rank 0's next start. Standard
library and protocol only: the launcher execs it without loading torch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from python_backend.protocol.settings import EngineSettings

logger = logging.getLogger("triton_chat.node")

REFUSED_EXIT = 4  # a rank whose settings differ from rank 0's: starting it again cannot help
WATCH_INTERVAL_S = 0.25
RESTART_PAUSE_S = 2.0  # between a node's ranks ending and starting again
STOP_GRACE_S = 10.0  # for ranks to end by themselves before they are terminated
_KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class RankPlan:
    rank: int
    world_size: int
    address: str  # "host:port" of rank 0's rendezvous


def python_executable() -> str:
    """This interpreter's program, also inside Triton's stub (where ``sys.executable`` is the stub)."""
    current = Path(sys.executable)
    if current.name.startswith("python") and current.is_file():
        return str(current)
    versioned = Path(sys.exec_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if versioned.is_file():
        return str(versioned)
    return shutil.which("python3") or "python3"


def spawn_rank(settings: EngineSettings, plan: RankPlan) -> subprocess.Popen[bytes]:
    """Start rank ``plan.rank``'s process; it ends by itself when this process is gone."""
    command = [
        python_executable(),
        "-m",
        "python_backend.parallel.worker",
        "--rank",
        str(plan.rank),
        "--address",
        plan.address,
        "--parent",
        str(os.getpid()),
        "--settings",
        json.dumps(settings.to_parameters()),
    ]
    # The worker imports what this process imports, from the same places.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen(command, env=env)


def end_ranks(workers: list[subprocess.Popen[bytes]], grace_s: float = 0.0) -> None:
    """Wait up to ``grace_s`` for the workers to exit, then terminate, then kill what is left."""
    deadline = time.monotonic() + grace_s
    for worker in workers:
        try:
            worker.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            logger.warning("tensor parallel: pid %d did not stop; terminating it", worker.pid)
            worker.terminate()
    for worker in workers:
        try:
            worker.wait(_KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def _first_exit(workers: list[subprocess.Popen[bytes]], first_rank: int, stop: threading.Event) -> tuple[int, int]:
    """(rank, exit code) of the first worker to exit; (-1, 0) once ``stop`` is set."""
    while not stop.wait(WATCH_INTERVAL_S):
        for offset, worker in enumerate(workers):
            code = worker.poll()
            if code is not None:
                return first_rank + offset, code
    return -1, 0


def run_node(settings: EngineSettings, stop: threading.Event) -> int:
    """Keep this node's ranks joined to rank 0 until ``stop``; 0, or 1 when rank 0 refused them."""
    first, count, world = settings.first_rank, settings.ranks_per_node, settings.tensor_parallel_size
    address = f"{settings.master_addr}:{settings.master_port}"
    while not stop.is_set():
        workers = [spawn_rank(settings, RankPlan(first + i, world, address)) for i in range(count)]
        logger.info(
            "node %d: ranks %d-%d started (pids %s); they join rank 0 at %s",
            settings.node_rank,
            first,
            first + count - 1,
            [w.pid for w in workers],
            address,
        )
        rank, code = _first_exit(workers, first, stop)
        if rank < 0:
            end_ranks(workers)
            logger.info("node %d: ranks stopped", settings.node_rank)
            return 0
        # The others fail at their next collective, or were told to stop: give them the time to.
        end_ranks(workers, STOP_GRACE_S)
        if code == REFUSED_EXIT:
            logger.error("node %d: rank %d was refused by rank 0 (see its log); stopping", settings.node_rank, rank)
            return 1
        logger.warning(
            "node %d: rank %d exited (code %d); starting the node's ranks again for rank 0's next start",
            settings.node_rank,
            rank,
            code,
        )
        stop.wait(RESTART_PAUSE_S)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", required=True, help="the model's parameters as JSON")
    args = parser.parse_args(argv)
    settings = EngineSettings.from_parameters(json.loads(args.settings))
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s node {settings.node_rank} %(name)s: %(message)s"
    )
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        logger.info("node %d: signal %d; stopping the ranks", settings.node_rank, signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)
    return run_node(settings, stop)


if __name__ == "__main__":
    raise SystemExit(main())
