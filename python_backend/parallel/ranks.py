"""Rank 0's side of a tensor-parallel model: starting, watching and stopping the other ranks.

Owns ``RankGroup``: it starts one worker process per extra rank (``worker.py``), joins the process
group with them, gives the engine its ``LeaderSync``, watches the processes (a rank that exits
makes ``problem()`` report the model failed, so the readiness probe turns 503 and the launcher
restarts the model as for a crashed stub), and at unload tells them to stop, then ends any that
do not. Workers also end by themselves when this process is gone, so none is left behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from python_backend.parallel.group import Channel, RankPlan, free_address, join, leave, rank_device, rank_settings
from python_backend.parallel.sync import LeaderSync
from python_backend.protocol.errors import ErrorInfo, rank_failed
from python_backend.protocol.settings import EngineSettings

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.25
STOP_TIMEOUT_S = 10.0  # for the workers to end after the stop message, before they are killed
_KILL_WAIT_S = 5.0


class RankStartError(RuntimeError):
    """A worker rank exited before the group was joined; the message names it."""


def python_executable() -> str:
    """This interpreter's program, also inside Triton's stub (where ``sys.executable`` is the stub)."""
    current = Path(sys.executable)
    if current.name.startswith("python") and current.is_file():
        return str(current)
    versioned = Path(sys.exec_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if versioned.is_file():
        return str(versioned)
    return shutil.which("python3") or "python3"


def _spawn(settings: EngineSettings, plan: RankPlan) -> subprocess.Popen[bytes]:
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


class RankGroup:
    def __init__(self, workers: list[subprocess.Popen[bytes]], channel: Channel, settings: EngineSettings) -> None:
        self.settings = settings  # rank 0's: its device and threads
        self.sync = LeaderSync(channel)
        self._workers = workers  # rank i + 1 is workers[i]
        self._failure: ErrorInfo | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._watch = threading.Thread(target=self._watch_workers, name="triton-chat-ranks", daemon=True)

    @staticmethod
    def start(settings: EngineSettings) -> RankGroup:
        """Start the workers and join the group with them (rank 0 is this process)."""
        world = settings.tensor_parallel_size
        address = free_address()
        workers = [_spawn(settings, RankPlan(rank, world, address)) for rank in range(1, world)]
        logger.info("tensor parallel: started ranks 1-%d (pids %s)", world - 1, [w.pid for w in workers])
        try:
            channel = _join_watching(RankPlan(0, world, address), rank_device(settings, 0), workers)
        except BaseException:
            _end(workers)
            raise
        group = RankGroup(workers, channel, rank_settings(settings, 0))
        group._watch.start()
        return group

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids, rank 1 first."""
        return [w.pid for w in self._workers]

    def problem(self) -> ErrorInfo | None:
        """None while every rank runs; else the 503 the readiness probe answers with."""
        with self._lock:
            return self._failure

    def close(self) -> None:
        """Stop the workers (call after rank 0's engine has stopped): ask, wait, then kill."""
        self._closing.set()
        if self.problem() is None:
            # On a thread with a deadline: a rank that hangs must not hold the unload.
            stopper = threading.Thread(target=self._send_stop, name="triton-chat-ranks-stop", daemon=True)
            stopper.start()
            stopper.join(STOP_TIMEOUT_S)
        _end(self._workers, STOP_TIMEOUT_S)
        self._watch.join(WATCH_INTERVAL_S * 4)
        leave()
        logger.info("tensor parallel: ranks stopped")

    def _send_stop(self) -> None:
        try:
            self.sync.stop()
        except RuntimeError:
            logger.exception("tensor parallel: the stop message did not reach every rank; ending them")

    def _watch_workers(self) -> None:
        while not self._closing.wait(WATCH_INTERVAL_S):
            for rank, worker in enumerate(self._workers, start=1):
                code = worker.poll()
                if code is not None and not self._closing.is_set():
                    logger.error("tensor parallel: rank %d (pid %d) exited with code %d", rank, worker.pid, code)
                    with self._lock:
                        self._failure = rank_failed(rank, code)
                    return


def _join_watching(plan: RankPlan, device: str, workers: list[subprocess.Popen[bytes]]) -> Channel:
    """``join`` on a thread, failing at once if a worker exits before every rank has joined."""
    joined: list[Channel] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            joined.append(join(plan, device))
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    joiner = threading.Thread(target=run, name="triton-chat-ranks-join", daemon=True)
    joiner.start()
    while joiner.is_alive():
        joiner.join(WATCH_INTERVAL_S)
        for rank, worker in enumerate(workers, start=1):
            code = worker.poll()
            if code is not None:
                raise RankStartError(f"tensor-parallel rank {rank} exited with code {code} before joining")
    if errors:
        raise errors[0]
    return joined[0]


def _end(workers: list[subprocess.Popen[bytes]], grace_s: float = 0.0) -> None:
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
