"""A child started by ``TiedSpawner`` is killed by the kernel when the launcher is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from openai_frontend.launcher.tied_child import TiedSpawner

ROOT = Path(__file__).resolve().parents[2]
EXIT_WAIT_S = 10.0
# A launcher stand-in: it starts `sleep` from a thread that then ends (as the supervisor's does),
# prints the child's pid and waits to be killed.
LAUNCHER = """
import subprocess, sys, threading
from openai_frontend.launcher.tied_child import TiedSpawner
spawner = TiedSpawner()
started = []
thread = threading.Thread(target=lambda: started.append(spawner.popen(["sleep", "600"], start_new_session=True)))
thread.start()
thread.join()
print(started[0].pid, flush=True)
sys.stdin.read()
"""


def test_the_child_outlives_the_thread_that_asked_but_not_the_process() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    child: psutil.Process | None = None
    try:
        assert launcher.stdout is not None
        child = psutil.Process(int(launcher.stdout.readline()))
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE  # the asking thread is gone
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        child.wait(EXIT_WAIT_S)  # raises psutil.TimeoutExpired if it stays
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if child is not None and child.is_running():
            child.kill()


def test_a_failed_start_raises_in_the_caller() -> None:
    with pytest.raises(FileNotFoundError):
        TiedSpawner().popen(["/nonexistent/program"])
