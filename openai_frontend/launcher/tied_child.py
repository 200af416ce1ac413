"""Child processes that die with the launcher, however it dies (SIGKILL included).

Owns ``TiedSpawner``: it starts children with Linux's parent-death signal (``PR_SET_PDEATHSIG``
set to SIGKILL), so that the kernel kills a child the moment the launcher is gone, where no
handler of ours can run. The kernel sends that signal when the *thread* that forked the child
ends, not the whole process, so every child is forked by one thread of the spawner's own, which
lives as long as the process (the supervisor's thread, which restarts tritonserver, ends before
the server is stopped in order). What tritonserver starts in turn (the model's stub, its
tensor-parallel ranks) ends by itself when its parent is gone (``python_backend.parallel.lifeline``).

No code of ours runs between fork and exec: the launcher has gRPC's threads and their fork
handlers by then, and a ``preexec_fn`` (a real ``fork()`` that runs Python in the copy) crashed
tritonserver's start with SIGSEGV. The child is a fresh, single-threaded ``python -I -S`` that
sets the signal and execs the command (``tie_and_exec``); subprocess starts it by ``vfork``.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

# Run by a fresh interpreter: argv = parent pid, signal, error fd, command... It sets the parent-death
# signal (1 is PR_SET_PDEATHSIG), checks that the parent did not die first, and execs the command,
# writing the errno to the error fd if that fails (the fd closes on a good exec, as subprocess's own).
_TIE_AND_EXEC = """
import ctypes, os, signal, sys
parent, sig, error_fd = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cmd = sys.argv[4:]
ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)
if os.getppid() != parent:
    os.kill(os.getpid(), signal.SIGKILL)
os.set_inheritable(error_fd, False)
try:
    os.execvp(cmd[0], cmd)
except OSError as exc:
    os.write(error_fd, str(exc.errno or 0).encode())
os._exit(127)
"""


def tied_popen(cmd: list[str], death_signal: signal.Signals, **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(cmd, **options)``; the kernel sends the child ``death_signal`` when the
    calling thread ends. Raises what Popen would (``FileNotFoundError`` for a missing program)."""
    if not sys.platform.startswith("linux"):
        logger.warning("no parent-death signal here: %s will not be stopped if the launcher is killed outright", cmd[0])
        return subprocess.Popen(cmd, **options)
    read_fd, write_fd = os.pipe()
    tie = [sys.executable, "-I", "-S", "-c", _TIE_AND_EXEC, str(os.getpid()), str(int(death_signal)), str(write_fd)]
    pass_fds = (*options.pop("pass_fds", ()), write_fd)
    try:
        proc = subprocess.Popen([*tie, *cmd], pass_fds=pass_fds, **options)
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as errors:
        error = errors.read()  # empty once the exec succeeded and closed the other end
    if error:
        proc.wait()
        code = int(error)
        raise OSError(code, os.strerror(code), cmd[0])  # OSError picks the subclass: FileNotFoundError, ...
    return proc


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
                start.process = tied_popen(start.cmd, signal.SIGKILL, **start.options)
            except BaseException as exc:  # handed to the caller, which raises it
                start.error = exc
            finally:
                start.done.set()
