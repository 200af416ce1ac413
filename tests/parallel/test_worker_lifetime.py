"""A worker rank never outlives rank 0: killing rank 0's process ends its workers by themselves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
WORKER_EXIT_S = 30.0
# Rank 0 as the Triton model starts it, in a process of its own that the test can kill.
RANK_ZERO = """
import sys
from python_backend.parallel.ranks import RankGroup
from python_backend.protocol.settings import EngineSettings
settings = EngineSettings(model_path=sys.argv[1], dtype="float32", device="cpu", tensor_parallel_size=2)
group = RankGroup.start(settings)
print(group.pids[0], flush=True)
sys.stdin.read()
"""


def test_workers_exit_when_rank_zero_is_killed(tiny_llama_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rank_zero = subprocess.Popen(
        [sys.executable, "-c", RANK_ZERO, str(tiny_llama_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    worker: psutil.Process | None = None
    try:
        assert rank_zero.stdout is not None
        worker = psutil.Process(int(rank_zero.stdout.readline()))
        assert worker.is_running()
        rank_zero.send_signal(signal.SIGKILL)
        rank_zero.wait()
        code = worker.wait(WORKER_EXIT_S)  # raises psutil.TimeoutExpired if it stays
        assert not worker.is_running()
        assert code is None or code != 0  # not a clean stop: it noticed rank 0 was gone
    finally:
        if rank_zero.poll() is None:
            rank_zero.kill()
            rank_zero.wait()
        if worker is not None and worker.is_running():  # a failed test leaves nothing behind
            worker.kill()
