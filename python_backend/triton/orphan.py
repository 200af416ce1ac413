"""The stub's end when tritonserver dies without stopping it.

Owns ``end_with_tritonserver``: started once at ``initialize``, it ends this process (Triton's
Python-backend stub, which runs the model) the moment its tritonserver is gone, and first removes
the shared-memory region the two shared, which nobody else would. Triton stops a stub itself on
any orderly shutdown; this covers the rest (tritonserver killed by SIGKILL or the OOM killer, or
``serve`` killed outright, whose tritonserver dies with it), where the stub would otherwise keep
its memory, devices and tensor-parallel ranks for minutes.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

from python_backend.cpu.native.build import build_library
from python_backend.parallel.lifeline import ORPHANED_EXIT, exit_with_parent

logger = logging.getLogger("triton_chat")

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"  # Triton names the stub's region on its command line


NATIVE_SOURCE = Path(__file__).resolve().parents[1] / "cpu" / "native" / "lifeline.c"


def end_with_tritonserver() -> None:
    """Watch tritonserver from a native thread (``native/lifeline.c``), which needs no GIL: a stub
    thread blocked while holding it cannot keep the stub alive, nor let Triton's own watchdog end
    the stub before its regions are removed. Python's lifeline where the C one cannot be built."""
    parent = os.getppid()
    if not start_native_lifeline(parent, own_regions(_own_cmdline()), "tritonserver"):
        exit_with_parent(parent, "tritonserver", _remove_own_regions)


def start_native_lifeline(parent: int, paths: list[Path], what: str) -> bool:
    """Whether the native lifeline now watches ``parent`` (removing ``paths`` before the exit)."""
    library = build_library(NATIVE_SOURCE, extra_flags=("-pthread",))
    if library is None:
        return False
    start = library.triton_chat_exit_with_parent
    start.restype = ctypes.c_int
    start.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    encoded = [os.fsencode(path) for path in paths]
    array = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
    message = f"triton-chat: {what} (pid {parent}) is gone; exiting\n".encode()
    failed = start(parent, array, len(encoded), message, ORPHANED_EXIT)
    if failed:
        logger.warning("the native lifeline did not start (%s): Python's watches %s", os.strerror(failed), what)
        return False
    return True


def _own_cmdline() -> list[str]:
    return Path("/proc/self/cmdline").read_bytes().decode("utf-8", "replace").split("\0")


def own_regions(cmdline: list[str]) -> list[Path]:
    """The shared-memory regions this stub's command line names."""
    return [SHM_DIR / arg for arg in cmdline if arg.startswith(SHM_PREFIX) and "/" not in arg]


def _remove_own_regions() -> None:
    for region in own_regions(_own_cmdline()):
        logger.info("removing the shared memory of a stopped tritonserver: %s", region)
        region.unlink(missing_ok=True)
