"""Pinning the engine thread's OpenMP team to CPUs, one thread per physical core.

Owns ``compute_cpus`` (which CPUs: the first logical CPU of each physical core the process may
run on) and ``bind_team`` (the C helper in ``thread_binding.c``, run on the engine thread).

Why: on a machine whose cores are all taken by the team, the serving processes (tritonserver,
the frontend, the stub's sender) still need CPU time now and then; pinned, a preempted compute
thread waits on its own core instead of being moved next to the other. vLLM's CPU backend binds
its OpenMP threads the same way (VLLM_CPU_OMP_THREADS_BIND). On the 2-core test machine it made no
difference beyond the noise (docs/performance.md), so it is opt-in (``cpu_bind_threads``).
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

from python_backend.cpu.native.build import build_library

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("thread_binding.c")
_SYMBOL = "triton_chat_bind_team"
_TOPOLOGY = Path("/sys/devices/system/cpu")


def _core_of(cpu: int, topology: Path) -> tuple[str, str]:
    """(package, core) of a logical CPU; the CPU itself when the topology cannot be read."""
    folder = topology / f"cpu{cpu}" / "topology"
    try:
        return (folder / "physical_package_id").read_text().strip(), (folder / "core_id").read_text().strip()
    except OSError:
        return ("cpu", str(cpu))


def compute_cpus(threads: int, allowed: set[int] | None = None, topology: Path = _TOPOLOGY) -> list[int] | None:
    """One logical CPU per physical core for ``threads`` threads, or None when there are fewer cores.

    ``allowed`` defaults to the CPUs this process may run on (a container's or taskset's limit).
    """
    cpus = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    first_of_core: dict[tuple[str, str], int] = {}
    for cpu in cpus:
        first_of_core.setdefault(_core_of(cpu, topology), cpu)
    chosen = sorted(first_of_core.values())
    return chosen[:threads] if threads <= len(chosen) else None


def bind_team(cpus: list[int]) -> bool:
    """Pin the calling thread's OpenMP team (its size set by ``torch.set_num_threads``) to ``cpus``.

    Call it on the engine thread. False, with the reason logged, when the helper cannot be built
    or the team is larger than the list; the engine then runs unpinned, as before.
    """
    library = build_library(SOURCE)
    if library is None:
        return False
    function = getattr(library, _SYMBOL)
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    bound = function((ctypes.c_int * len(cpus))(*cpus), len(cpus))
    if bound < 0:
        logger.warning("the OpenMP team is larger than the %d CPUs given: left unpinned", len(cpus))
        return False
    logger.info("engine's %d compute threads pinned to CPUs %s", bound, cpus[:bound])
    return bound > 0
