"""The stub's end when tritonserver dies without stopping it.

Owns ``end_with_tritonserver``: started once at ``initialize``, it ends this process (Triton's
Python-backend stub, which runs the model) the moment its tritonserver is gone, and first removes
the shared-memory region the two shared, which nobody else would. Triton stops a stub itself on
any orderly shutdown; this covers the rest (tritonserver killed by SIGKILL or the OOM killer, or
``serve`` killed outright, whose tritonserver dies with it), where the stub would otherwise keep
its memory, devices and tensor-parallel ranks for minutes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from python_backend.parallel.lifeline import exit_with_parent

logger = logging.getLogger("triton_chat")

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"  # Triton names the stub's region on its command line


def end_with_tritonserver() -> None:
    exit_with_parent(os.getppid(), "tritonserver", _remove_own_regions)


def own_regions(cmdline: list[str]) -> list[Path]:
    """The shared-memory regions this stub's command line names."""
    return [SHM_DIR / arg for arg in cmdline if arg.startswith(SHM_PREFIX) and "/" not in arg]


def _remove_own_regions() -> None:
    cmdline = Path("/proc/self/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    for region in own_regions(cmdline):
        logger.info("removing the shared memory of a stopped tritonserver: %s", region)
        region.unlink(missing_ok=True)
