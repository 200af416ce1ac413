"""Rank 0's rendezvous: where the ranks of every node meet before they form their process group.

Owns the key/value store rank 0 listens with (``listen``: at ``master_addr:master_port`` across
nodes, a free loopback port on one node), the other ranks' entry (``enter``: connect, waiting for
rank 0 as long as it takes; claim their rank, which a store whose group already runs refuses, so
a rank never joins a rendezvous that is over; and check their node's settings against rank 0's),
rank 0's bounded wait for every rank (``await_ranks``, naming the nodes that are missing), the
heartbeat of the ranks on other nodes and the network interface their gloo traffic takes.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from python_backend.parallel.lifeline import ORPHANED_EXIT
from python_backend.parallel.node import RankPlan
from python_backend.protocol.settings import EngineSettings, setting_info

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 300.0  # rank 0's wait for every rank to enter (its model load fails after it)
CONNECT_TRY_S = 5.0  # one attempt of a rank to reach rank 0's store
RETRY_PAUSE_S = 1.0
BEAT_S = 1.0  # how often a rank on another node says it is alive
STORE_TIMEOUT = timedelta(seconds=600)  # one store operation, once connected
_SETTINGS_KEY = "triton_chat/settings"
# Settings each node may set for itself: its own folder, devices, threads and memory budgets
# (the ranks agree on the smallest budget), and its own index. The rest must match rank 0's.
NODE_LOCAL = frozenset(
    {"model_path", "served_model_name", "device", "device_ids", "torch_threads", "node_rank"}
    | {"kv_cache_memory_mb", "prefix_cache_memory_mb"}
)
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


class RendezvousError(RuntimeError):
    """The ranks cannot meet: rank 0 cannot listen, a rank is missing, or a node was refused."""


class RankRefused(RendezvousError):
    """This rank's node was given settings that differ from rank 0's."""


def _joined_key(rank: int) -> str:
    return f"triton_chat/joined/{rank}"


def _refused_key(rank: int) -> str:
    return f"triton_chat/refused/{rank}"


def _beat_key(rank: int) -> str:
    return f"triton_chat/beat/{rank}"


def rendezvous_address(settings: EngineSettings, free: Callable[[str], str]) -> str:
    """``master_addr:master_port``; on one node either may be left out: then loopback, and
    ``free(host)``, a port free now."""
    host = settings.master_addr or "127.0.0.1"
    return f"{host}:{settings.master_port}" if settings.master_port else free(host)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def listen(address: str, settings: EngineSettings) -> dist.TCPStore:
    """Rank 0's store at ``address``, holding rank 0's settings for the other ranks to check."""
    host, port = _split(address)
    try:
        store = dist.TCPStore(host, port, is_master=True, timeout=STORE_TIMEOUT, wait_for_workers=False)
    except RuntimeError as exc:
        raise RendezvousError(
            f"tensor parallel: rank 0 cannot listen at {address} for the other ranks "
            f"(--master-addr/--master-port): {exc}"
        ) from exc
    store.set(_SETTINGS_KEY, json.dumps(settings.to_parameters()))
    return store


def enter(plan: RankPlan, settings: EngineSettings) -> dist.TCPStore:
    """Reach rank 0's store, waiting as long as it takes; claim ``plan.rank`` there (a store whose
    group already runs has it claimed: wait for rank 0's next one); check the settings."""
    host, port = _split(plan.address)
    waiting = False
    while True:
        try:
            store = dist.TCPStore(
                host, port, is_master=False, timeout=timedelta(seconds=CONNECT_TRY_S), wait_for_workers=False
            )
        except RuntimeError as exc:
            if not waiting:
                logger.info("rank %d: waiting for rank 0 at %s (%s)", plan.rank, plan.address, str(exc)[:200])
                waiting = True
            time.sleep(RETRY_PAUSE_S)
            continue
        if store.add(_joined_key(plan.rank), 1) == 1:
            break
        if not waiting:
            logger.info(
                "rank %d: rank 0 at %s runs a group already; waiting for its next start", plan.rank, plan.address
            )
            waiting = True
        del store
        time.sleep(RETRY_PAUSE_S)
    store.set_timeout(STORE_TIMEOUT)
    theirs = json.loads(store.get(_SETTINGS_KEY))
    differences = settings_differences(settings.to_parameters(), theirs)
    if differences:
        message = (
            f"tensor parallel: node {settings.node_rank} (rank {plan.rank}) was given settings that differ "
            f"from node 0's: {'; '.join(differences)}. Give every node the same flags"
        )
        store.set(_refused_key(plan.rank), message)
        raise RankRefused(message)
    return store


def settings_differences(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """Each shared setting whose value here differs from rank 0's, as ``--flag here vs node 0``."""
    flags = {spec.name: setting_info(spec).flag or spec.name for spec in fields(EngineSettings)}
    return [
        f"{flags.get(key, key)} {mine.get(key)!r} here, {theirs.get(key)!r} on node 0"
        for key in sorted(set(mine) | set(theirs))
        if key not in NODE_LOCAL and mine.get(key) != theirs.get(key)
    ]


def await_ranks(
    store: dist.TCPStore,
    settings: EngineSettings,
    address: str,
    check: Callable[[], None],
    timeout_s: float = JOIN_TIMEOUT_S,
) -> None:
    """Rank 0: wait until every other rank has entered, calling ``check`` (which raises when a
    local rank died) meanwhile; after ``timeout_s`` fail naming the nodes still missing."""
    world = settings.tensor_parallel_size
    deadline = time.monotonic() + timeout_s
    while True:
        for rank in range(1, world):
            if store.check([_refused_key(rank)]):
                raise RendezvousError(store.get(_refused_key(rank)).decode())
        missing = [rank for rank in range(1, world) if not store.check([_joined_key(rank)])]
        if not missing:
            logger.info("tensor parallel: all %d ranks of %d node(s) entered at %s", world, settings.nnodes, address)
            return
        check()
        if time.monotonic() > deadline:
            raise RendezvousError(_missing_message(missing, settings, address, timeout_s))
        time.sleep(0.25)


def _missing_message(missing: list[int], settings: EngineSettings, address: str, timeout_s: float) -> str:
    per_node = settings.ranks_per_node
    nodes = sorted({rank // per_node for rank in missing})
    remote = [node for node in nodes if node > 0]
    what = ", ".join(f"node {node} (ranks {node * per_node}-{node * per_node + per_node - 1})" for node in nodes)
    hint = (
        f"; start `triton-chat worker --node-rank {remote[0]}` there with node 0's flags (--nnodes "
        f"{settings.nnodes} --master-addr {settings.master_addr} --master-port {settings.master_port}), and "
        f"check that it reaches {address}"
        if remote
        else ""
    )
    return f"tensor parallel: {what} did not join rank 0 at {address} within {timeout_s:.0f} s{hint}"


def use_interface_toward(host: str) -> None:
    """Make gloo send over the interface that reaches ``host`` (rank 0's address), unless the user
    named one: its default, the interface of this machine's host name, may not reach other nodes."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    try:
        name = interface_toward(host)
    except OSError as exc:  # no route there (yet): the store was reached, so gloo may still find one
        logger.warning("tensor parallel: no route toward %s (%s); gloo picks its own interface", host, exc)
        return
    if name is None:
        logger.warning("tensor parallel: no interface found toward %s; gloo picks its own", host)
        return
    os.environ["GLOO_SOCKET_IFNAME"] = name
    logger.info("tensor parallel: gloo uses interface %s (toward %s)", name, host)


def interface_toward(host: str) -> str | None:
    """The name of the IPv4 interface whose address this machine uses to reach ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # UDP: only picks the route, sends nothing
        local = probe.getsockname()[0]
    for _, name in socket.if_nameindex():
        if _ipv4_address(name) == local:
            return name
    return None


def _ipv4_address(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


def start_heartbeat(store: dist.TCPStore, rank: int) -> threading.Thread:
    """A rank on another node counts its beats in rank 0's store (rank 0 watches them); when the
    store is gone, rank 0's process is: this rank ends at once rather than wait on a collective."""

    def beat() -> None:
        while True:
            try:
                store.add(_beat_key(rank), 1)
            except RuntimeError:
                logger.error("rank %d: rank 0's store is gone; exiting", rank)
                os._exit(ORPHANED_EXIT)
            time.sleep(BEAT_S)

    thread = threading.Thread(target=beat, name="triton-chat-beat", daemon=True)
    thread.start()
    return thread


class Beats:
    """Rank 0's view of the other nodes' heartbeats: which rank has been silent for too long."""

    def __init__(self, store: Any, ranks: range, silence_s: float) -> None:
        self._store = store
        self._silence_s = silence_s
        now = time.monotonic()
        self._last: dict[int, tuple[int, float]] = {rank: (-1, now) for rank in ranks}

    def silent(self) -> int | None:
        """The first rank whose count has not moved for ``silence_s``; None while all beat."""
        now = time.monotonic()
        for rank, (count, since) in self._last.items():
            current = int(self._store.add(_beat_key(rank), 0))
            if current != count:
                self._last[rank] = (current, now)
            elif now - since > self._silence_s:
                return rank
        return None
