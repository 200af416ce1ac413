"""Ending a model's process as soon as the process that started it is gone.

Owns ``exit_with_parent``: a thread that waits for this process's parent to exit and then ends
this process at once, after an optional last clean-up. Triton's stub (the model's process) uses
it on tritonserver, so that a server killed without the chance to stop its stub (SIGKILL, the
OOM killer, a ``serve`` killed outright, whose tritonserver dies with it) leaves no model process
holding its memory, devices and shared memory; worker ranks use it on rank 0's process.
Standard library only.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("triton_chat")

ORPHANED_EXIT = 3  # the exit status of a process whose parent went away
_POLL_S = 0.5  # only where the kernel has no pidfd (before Linux 5.3)


def exit_with_parent(parent: int, what: str, cleanup: Callable[[], None] | None = None) -> threading.Thread:
    """End this process (status ``ORPHANED_EXIT``) once ``parent`` exits; ``what`` names the
    parent in the one log line; ``cleanup`` runs first (its failure is logged, not fatal)."""

    def watch() -> None:
        _wait_until_gone(parent)
        logger.error("%s (pid %d) is gone; exiting", what, parent)
        if cleanup is not None:
            try:
                cleanup()
            except Exception:
                logger.exception("clean-up before exiting failed")
        os._exit(ORPHANED_EXIT)  # nothing left to wait for: whoever this process served is gone

    thread = threading.Thread(target=watch, name="triton-chat-lifeline", daemon=True)
    thread.start()
    return thread


def _wait_until_gone(parent: int) -> None:
    try:
        handle = os.pidfd_open(parent)
    except OSError:  # no pidfd here, or the parent is gone already
        while os.getppid() == parent:
            time.sleep(_POLL_S)
        return
    try:
        # The pid may have been reused between our start and the open: it is ours only if it
        # is still our parent now that the handle pins it.
        if os.getppid() == parent:
            select.select([handle], [], [])  # readable once the process has exited
    finally:
        os.close(handle)
