"""A process group read from ``/proc``: its members, their command lines, killing it.

Owns the Linux-only helpers ``TritonServerProcess`` uses to find the Python-backend stubs of its
server (members of the server's process group) and to make sure none outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def group_members(pgid: int, include_zombies: bool = True) -> list[int]:
    """The pids whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # the process ended while we looked
        # After the command name (field 2, may hold spaces): state, ppid, process group.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and (include_zombies or fields[0] != "Z"):
            members.append(int(entry.name))
    return members


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # gone (and reaped)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def cmdline(pid: int) -> list[str]:
    """The process's arguments; [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def group_alive(pgid: int) -> bool:
    # Zombies do not count: in a container whose init does not reap, they never disappear.
    return bool(group_members(pgid, include_zombies=False))


def kill_group(pgid: int) -> None:
    # Already gone is the goal, not an error.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
