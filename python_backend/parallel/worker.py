"""A worker rank's process: ``python -m python_backend.parallel.worker``, started by rank 0 for
the other ranks of its node, and by ``node.py`` on the other nodes.

Owns the worker's life: enter rank 0's rendezvous and join the group, load this rank's shard, run
the engine as a follower of rank 0 until rank 0 says stop (exit 0), and exit at once when the
process that started it is gone (its parent) or the engine loop fails (exit 1), so that no worker
outlives its model; a node whose settings rank 0 refused exits ``REFUSED_EXIT``.
"""

from __future__ import annotations

import argparse
import json
import logging

from python_backend.engine.engine import Engine
from python_backend.model.loader import load_model
from python_backend.parallel.group import join, leave, rank_settings
from python_backend.parallel.lifeline import exit_with_parent
from python_backend.parallel.node import REFUSED_EXIT, RankPlan
from python_backend.parallel.rendezvous import RankRefused, enter, start_heartbeat
from python_backend.parallel.sync import FollowerSync
from python_backend.protocol.settings import EngineSettings

logger = logging.getLogger("triton_chat.rank")

HEALTH_POLL_S = 0.5  # how often the engine loop is checked while rank 0 runs


def run(settings: EngineSettings, plan: RankPlan) -> int:
    """Serve as rank ``plan.rank`` until rank 0 stops the group; the process's exit code."""
    mine = rank_settings(settings, plan.rank)
    try:
        store = enter(plan, settings)
    except RankRefused as exc:
        logger.error("%s", exc)
        return REFUSED_EXIT
    channel = join(plan, mine.device, store, settings.nnodes)
    if settings.node_rank > 0:
        start_heartbeat(store, plan.rank)
    try:
        loaded = load_model(mine)
        sync = FollowerSync(channel, loaded)
        engine = Engine(loaded, mine, ranks=sync)
        engine.start()
        while not sync.stopped.wait(HEALTH_POLL_S):
            if not engine.health().running:
                logger.error("rank %d: the engine loop ended before rank 0 stopped it", plan.rank)
                return 1
        engine.stop()
        return 0
    finally:
        leave()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--address", required=True, help="host:port of rank 0's rendezvous")
    parser.add_argument("--parent", type=int, required=True, help="the process that started this rank")
    parser.add_argument("--settings", required=True, help="the model's parameters as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s rank {args.rank} %(name)s: %(message)s")
    exit_with_parent(args.parent, "the process that started this rank")
    settings = EngineSettings.from_parameters(json.loads(args.settings))
    return run(settings, RankPlan(args.rank, settings.tensor_parallel_size, args.address))


if __name__ == "__main__":
    raise SystemExit(main())
