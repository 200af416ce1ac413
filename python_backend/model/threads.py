"""Which thread runs PyTorch's parallel CPU work, and with how many OpenMP threads.

Owns ``serialize_current_thread``, ``engine_thread_count``, ``use_compute_threads`` (the engine
thread's team: its size, and on CPU its threads pinned one per core, ``native/thread_binding.py``),
``set_team_size`` (how the engine's thread tuner, ``engine/thread_tuner.py``, resizes that team
between steps) and ``confine_serving_threads`` (in a process that only serves the model, every
other thread shares the engine thread's core). PyTorch's CPU build uses GNU
OpenMP, which gives every thread that enters a parallel region its own team of worker threads.
When the thread that loaded the model (Triton's stub thread) has a team and the engine thread
starts a second one, libgomp counts more threads than cores and switches every team to
near-zero spinning, so each of the thousand small parallel regions in a decode step waits on a
futex wake-up. Measured on the 2-core test machine (SmolLM2-135M, bfloat16): a decode step took
47 ms at batch 1 and 66 ms at batch 16 on the engine thread, against 30 and 48 ms when the
loading thread never had a team. So the loading thread runs torch serially, and only the engine
thread (which runs every forward pass) uses several threads.
"""

from __future__ import annotations

import logging
import os

import torch

from python_backend.cpu.native.thread_binding import bind_team, compute_cpus

logger = logging.getLogger(__name__)


def engine_thread_count(requested: int) -> int:
    """The engine's intra-op threads: ``requested`` if set, else the calling thread's torch count."""
    return requested if requested > 0 else torch.get_num_threads()


def serialize_current_thread() -> int:
    """Keep this thread's torch work on itself, so it never starts an OpenMP team of its own.

    Call it on the thread that loads the model and serves requests, before any torch work there;
    returns the thread count torch had chosen, for the engine thread to use instead (``Engine``
    sets it when its thread starts).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads


def pinned_cpus(threads: int, on_cpu: bool, bind: bool) -> list[int] | None:
    """The CPUs to pin the engine's team to (one per physical core), or None to leave it unpinned:
    not on CPU, binding off, a single thread, or fewer cores than threads."""
    if not (on_cpu and bind) or threads < 2:
        return None
    cpus = compute_cpus(threads)
    if cpus is None:
        logger.info("%d compute threads and fewer cores to pin them to: left unpinned", threads)
    return cpus


def use_compute_threads(threads: int, cpus: list[int] | None) -> None:
    """On the engine thread: run torch with ``threads`` OpenMP threads, pinned to ``cpus``."""
    torch.set_num_threads(threads)
    if cpus is not None:
        bind_team(cpus)


def set_team_size(threads: int) -> None:
    """On the engine thread: the size of its OpenMP team from the next parallel region on."""
    torch.set_num_threads(threads)


def confine_serving_threads(cpu: int) -> None:
    """Pin every thread of this process to ``cpu``, the core the engine thread will be pinned to.

    For the Triton stub, a process that only serves the model: call it after loading and before
    the engine, sender and watcher threads start (they inherit it); the engine thread then pins its
    team one thread per core, so the stub's own threads (reading requests, sending responses,
    asking about cancellations) share the engine thread's core and leave the other compute threads
    alone (docs/performance.md).
    """
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), {cpu})
        except OSError as exc:  # a thread that ended meanwhile, or a restricted container
            logger.debug("thread %s keeps its CPUs: %s", task, exc)
