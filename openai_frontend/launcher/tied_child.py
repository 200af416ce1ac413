"""Child processes that die with the launcher, however it dies (SIGKILL included).

Owns ``TiedSpawner``: it starts children with Linux's parent-death signal (``PR_SET_PDEATHSIG``
set to SIGKILL), so that the kernel kills a child the moment the launcher is gone, where no
handler of ours can run. The kernel sends that signal when the *thread* that forked the child
ends, not the whole process, so every child is forked by one thread of the spawner's own, which
lives as long as the process (the supervisor's thread, which restarts tritonserver, ends before
the server is stopped in order). What tritonserver starts in turn (the model's stub, its
tensor-parallel ranks) ends by itself when its parent is gone (``python_backend.parallel.lifeline``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass
class _Start:
    """One child to start, and what came of it."""

    cmd: list[str]
    options: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    process: subprocess.Popen[bytes] | None = None
    error: BaseException | None = None


class TiedSpawner:
    """Starts children tied to this process's life, from one long-lived thread."""

    def __init__(self) -> None:
        self._starts: queue.SimpleQueue[_Start] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._prctl = _prctl()

    def popen(self, cmd: list[str], **options: Any) -> subprocess.Popen[bytes]:
        """``subprocess.Popen(cmd, **options)``, the child killed when this process dies."""
        start = _Start(cmd, options)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="triton-chat-spawner", daemon=True)
                self._thread.start()
        self._starts.put(start)
        start.done.wait()
        if start.process is None:
            raise start.error or RuntimeError(f"{cmd[0]} was not started")
        return start.process

    def _run(self) -> None:
        while True:
            start = self._starts.get()
            try:
                start.process = subprocess.Popen(start.cmd, preexec_fn=self._tie(os.getpid()), **start.options)  # noqa: PLW1509 - see _tie
            except BaseException as exc:  # handed to the caller, which raises it
                start.error = exc
            finally:
                start.done.set()

    def _tie(self, parent: int) -> Callable[[], None] | None:
        """What the child runs between fork and exec: async-signal-safe calls only, no locks."""
        prctl = self._prctl
        if prctl is None:
            return None

        def tie() -> None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the launcher died before the tie was made
                os.kill(os.getpid(), signal.SIGKILL)

        return tie


def _prctl() -> Any:
    """libc's ``prctl``, looked up before any fork; None where there is none (not Linux)."""
    name = ctypes.util.find_library("c")
    try:
        prctl = ctypes.CDLL(name, use_errno=True).prctl
    except (OSError, AttributeError):
        logger.warning("no prctl here: tritonserver will not be stopped if the launcher is killed outright")
        return None
    return prctl
