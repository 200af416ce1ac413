"""A child started by ``TiedSpawner`` is killed by the kernel when the launcher is killed outright."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from openai_frontend.launcher.tied_child import TiedSpawner
from tests.fixtures.orphans import kill_outright, parent_and_child

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
    with parent_and_child(LAUNCHER) as (launcher, child):
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE  # the asking thread is gone
        kill_outright(launcher)
        child.wait(EXIT_WAIT_S)  # raises psutil.TimeoutExpired if it stays


def test_a_failed_start_raises_in_the_caller() -> None:
    with pytest.raises(FileNotFoundError):
        TiedSpawner().popen(["/nonexistent/program"])


def test_a_program_that_cannot_run_raises_permission_error(tmp_path: Path) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        TiedSpawner().popen([str(script)])


def test_the_popen_is_the_program_itself_with_its_options(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with open(out, "wb") as sink:
        proc = TiedSpawner().popen(
            ["sh", "-c", "umask; echo $MARK"], stdout=sink, env={"MARK": "x", "PATH": os.defpath}, umask=0o077
        )
    assert proc.wait(EXIT_WAIT_S) == 0
    assert out.read_text().split() == ["0077", "x"]


# Python code in the forked copy of a process with other threads (gRPC's, in the frontend) is what
# crashed tritonserver's start; a Python after-fork hook tells whether any runs there.
FORK_HOOK = """
import os, sys
from openai_frontend.launcher.tied_child import TiedSpawner
os.register_at_fork(after_in_child=lambda: os.write(2, b"python ran in the forked child\\n"))
proc = TiedSpawner().popen(["true"])
sys.exit(proc.wait())
"""


def test_no_python_runs_between_fork_and_exec() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", FORK_HOOK], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "python ran in the forked child" not in done.stderr
