"""The ranks' process group: which backend, which device each rank uses, joining and leaving.

Owns the backend per device (gloo on CPU, NCCL on CUDA, HCCL on Ascend), each rank's
settings (its device and CPU threads), and ``Channel``: pickled messages from rank 0 to the
others, over gloo even where the tensors go over NCCL or HCCL, so that a step's few bytes of
bookkeeping never wait behind the device queue.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from python_backend.model.device import resolve_device
from python_backend.parallel.node import RankPlan
from python_backend.parallel.rendezvous import use_interface_toward
from python_backend.protocol.settings import EngineSettings

logger = logging.getLogger(__name__)

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
# Joining waits for every rank to start, a collective for every rank to arrive. A rank that is
# gone makes the others fail at once (its sockets close); this bounds one that hangs.
COLLECTIVE_TIMEOUT = timedelta(seconds=600)


def free_address(host: str = "127.0.0.1") -> str:
    """A ``host:port`` nobody listens on now, for rank 0's rendezvous (ranks share one host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return f"{host}:{probe.getsockname()[1]}"


def rank_device(settings: EngineSettings, rank: int) -> str:
    """The device of ``rank`` on its node: ``device_ids[local]``, else the device's own index plus
    ``local``, where ``local`` is the rank's place among its node's ranks."""
    device = resolve_device(settings.device)
    if device.type == "cpu":
        return "cpu"
    local = rank % settings.ranks_per_node
    ids = settings.rank_device_ids
    index = ids[local] if ids else (device.index or 0) + local
    return f"{device.type}:{index}"


def rank_settings(settings: EngineSettings, rank: int) -> EngineSettings:
    """``settings`` as rank ``rank`` runs them: its own device, and on CPU its share of its node's cores."""
    device = rank_device(settings, rank)
    threads = settings.torch_threads
    if device == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, (threads or cores) // settings.ranks_per_node)
    return dataclasses.replace(settings, device=device, torch_threads=threads)


def bind_device(device: str) -> None:
    """Make ``device`` this process's current accelerator (NCCL and HCCL use the current one)."""
    kind = device.split(":", 1)[0]
    if kind == "cuda":
        torch.cuda.set_device(torch.device(device))
    elif kind == "npu":
        npu: Any = getattr(torch, "npu", None)
        if npu is None:
            raise RuntimeError("device 'npu' needs torch_npu")
        npu.set_device(device)


class Channel:
    """Rank 0 tells every other rank one picklable object at a time, in order."""

    def __init__(self, group: Any) -> None:
        self._group = group  # None: the default group (gloo already)

    def send(self, message: object) -> None:
        dist.broadcast_object_list([message], src=0, group=self._group)

    def receive(self) -> object:
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def gather(self, value: object) -> list[object]:
        """Every rank's ``value``, in rank order, on every rank."""
        out: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(out, value, group=self._group)
        return out


def join(plan: RankPlan, device: str, store: Any, nodes: int) -> Channel:
    """Join the group through rank 0's ``store`` (blocks until every rank has); the channel for
    step messages. Across ``nodes`` > 1, gloo takes the interface toward rank 0's address."""
    bind_device(device)
    backend = BACKENDS[device.split(":", 1)[0]]
    if nodes > 1:
        use_interface_toward(plan.address.rpartition(":")[0])
    dist.init_process_group(
        backend,
        store=store,
        rank=plan.rank,
        world_size=plan.world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    control = None if backend == "gloo" else dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    logger.info("tensor parallel: rank %d of %d joined over %s on %s", plan.rank, plan.world_size, backend, device)
    return Channel(control)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
