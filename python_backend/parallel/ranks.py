"""Rank 0's side of a tensor-parallel model: starting, watching and stopping the other ranks.

Owns ``RankGroup``: it opens rank 0's rendezvous (``rendezvous.py``), starts one worker process
per other rank of node 0 (``node.py``), waits a bounded time for every rank of every node to
enter, joins the process group with them, gives the engine its ``LeaderSync``, watches them (a
local rank that exits, or a rank on another node whose heartbeat stops, makes ``problem()`` report
the model failed, so the readiness probe turns 503 and the launcher restarts the model as for a
crashed stub), and at unload tells them to stop, then ends the local ones that do not. Workers
also end by themselves when this process is gone, so none is left behind.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from typing import Any

from python_backend.parallel.group import Channel, free_address, join, leave, rank_device, rank_settings
from python_backend.parallel.node import RankPlan, end_ranks, spawn_rank
from python_backend.parallel.rendezvous import Beats, await_ranks, listen, rendezvous_address
from python_backend.parallel.sync import LeaderSync
from python_backend.protocol.errors import ErrorInfo, rank_failed, rank_silent
from python_backend.protocol.settings import EngineSettings

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.25
STOP_TIMEOUT_S = 10.0  # for the workers to end after the stop message, before they are killed
# A rank on another node beats every second; this much silence means its node is gone (a node
# cut off, or stopped without closing its sockets: a killed process fails the next collective).
REMOTE_SILENCE_S = 15.0


class RankStartError(RuntimeError):
    """A worker rank exited before the group was joined; the message names it."""


class RankGroup:
    def __init__(
        self, workers: list[subprocess.Popen[bytes]], channel: Channel, settings: EngineSettings, store: Any
    ) -> None:
        self.settings = settings  # rank 0's: its device and threads
        self.sync = LeaderSync(channel)
        self._workers = workers  # rank i + 1 is workers[i]
        self._store: Any = store  # the rendezvous; its server lives as long as this group
        remote = range(settings.ranks_per_node, settings.tensor_parallel_size)
        self._beats = Beats(store, remote, REMOTE_SILENCE_S) if remote else None
        self._failure: ErrorInfo | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._watch = threading.Thread(target=self._watch_workers, name="triton-chat-ranks", daemon=True)

    @staticmethod
    def start(settings: EngineSettings, join_timeout_s: float | None = None) -> RankGroup:
        """Open the rendezvous, start node 0's other ranks, wait for every node's (at most
        ``join_timeout_s``, else the rendezvous' default) and join the group (rank 0 is this process)."""
        world = settings.tensor_parallel_size
        address = rendezvous_address(settings, free_address)
        store = listen(address, settings)
        workers = [spawn_rank(settings, RankPlan(rank, world, address)) for rank in range(1, settings.ranks_per_node)]
        if workers:
            logger.info("tensor parallel: started ranks 1-%d (pids %s)", len(workers), [w.pid for w in workers])
        if settings.nnodes > 1:
            logger.info("tensor parallel: waiting at %s for the ranks of nodes 1-%d", address, settings.nnodes - 1)
        try:
            timeout = {} if join_timeout_s is None else {"timeout_s": join_timeout_s}
            await_ranks(store, settings, address, lambda: _check_started(workers), **timeout)
            channel = _join_watching(RankPlan(0, world, address), rank_device(settings, 0), workers, store, settings)
        except BaseException:
            end_ranks(workers)
            raise
        group = RankGroup(workers, channel, rank_settings(settings, 0), store)
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
        end_ranks(self._workers, STOP_TIMEOUT_S)
        self._watch.join(WATCH_INTERVAL_S * 4)
        leave()
        self._store = None  # closes rank 0's rendezvous: the other nodes wait for the next one
        self._beats = None
        logger.info("tensor parallel: ranks stopped")

    def _send_stop(self) -> None:
        try:
            self.sync.stop()
        except RuntimeError:
            logger.exception("tensor parallel: the stop message did not reach every rank; ending them")

    def _watch_workers(self) -> None:
        while not self._closing.wait(WATCH_INTERVAL_S):
            failure = self._local_failure() or self._remote_failure()
            if failure is not None and not self._closing.is_set():
                with self._lock:
                    self._failure = failure
                return

    def _local_failure(self) -> ErrorInfo | None:
        for rank, worker in enumerate(self._workers, start=1):
            code = worker.poll()
            if code is not None:
                logger.error("tensor parallel: rank %d (pid %d) exited with code %d", rank, worker.pid, code)
                return rank_failed(rank, code)
        return None

    def _remote_failure(self) -> ErrorInfo | None:
        beats = self._beats
        if beats is None:
            return None
        try:
            rank = beats.silent()
        except RuntimeError:  # the store closed under us: the group is closing
            return None
        if rank is None:
            return None
        node = rank // self.settings.ranks_per_node
        logger.error("tensor parallel: rank %d on node %d has been silent for %.0f s", rank, node, REMOTE_SILENCE_S)
        return rank_silent(rank, node, REMOTE_SILENCE_S)


def _check_started(workers: list[subprocess.Popen[bytes]]) -> None:
    for rank, worker in enumerate(workers, start=1):
        code = worker.poll()
        if code is not None:
            raise RankStartError(f"tensor-parallel rank {rank} exited with code {code} before joining")


def _join_watching(
    plan: RankPlan, device: str, workers: list[subprocess.Popen[bytes]], store: Any, settings: EngineSettings
) -> Channel:
    """``join`` on a thread, failing at once if a worker exits before every rank has joined."""
    joined: list[Channel] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            joined.append(join(plan, device, store, settings.nnodes))
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    joiner = threading.Thread(target=run, name="triton-chat-ranks-join", daemon=True)
    joiner.start()
    while joiner.is_alive():
        joiner.join(WATCH_INTERVAL_S)
        _check_started(workers)
    if errors:
        raise errors[0]
    return joined[0]
