"""A worker rank never outlives rank 0: killing rank 0's process ends its workers by themselves."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.orphans import kill_outright, parent_and_child

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
    with parent_and_child(RANK_ZERO, str(tiny_llama_dir)) as (rank_zero, worker):
        assert worker.is_running()
        kill_outright(rank_zero)
        code = worker.wait(WORKER_EXIT_S)  # raises psutil.TimeoutExpired if it stays
        assert not worker.is_running()
        assert code is None or code != 0  # not a clean stop: it noticed rank 0 was gone
