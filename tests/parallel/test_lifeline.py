"""A process with a lifeline ends, after its clean-up, as soon as its parent is killed."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from python_backend.cpu.native.build import build_library
from python_backend.parallel.lifeline import ORPHANED_EXIT
from python_backend.triton.orphan import NATIVE_SOURCE, SHM_DIR, own_regions
from tests.fixtures.orphans import kill_outright, parent_and_child

EXIT_WAIT_S = 10.0
# The parent starts the child and prints its pid; the child's lifeline cleans up a file it names.
PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(child.pid, flush=True)
sys.stdin.read()
"""
CHILD = """
import os, sys, threading
from pathlib import Path
from python_backend.parallel.lifeline import exit_with_parent
marker = Path(sys.argv[1])
exit_with_parent(os.getppid(), "the test's parent", lambda: marker.unlink())
marker.write_text("alive")
threading.Event().wait()
"""


def _armed(child: psutil.Process, marker: Path) -> None:
    """Wait until the child has written its marker; fail if it ends or takes too long first."""
    deadline = time.monotonic() + EXIT_WAIT_S
    while not marker.exists():
        assert time.monotonic() < deadline and child.is_running(), "the child never started"
        time.sleep(0.05)


def test_the_child_cleans_up_and_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    marker = tmp_path / "alive"
    with parent_and_child(PARENT, CHILD, str(marker)) as (parent, child):
        _armed(child, marker)
        kill_outright(parent)
        # The child is the parent's: reparented, its exit status goes to init; psutil sees it end.
        child.wait(EXIT_WAIT_S)  # raises psutil.TimeoutExpired if it stays
        assert not marker.exists()  # the clean-up ran before the exit


def test_the_stub_removes_only_the_regions_its_command_line_names() -> None:
    cmdline = ["triton_python_backend_stub", "/models/1/model.py", "triton_python_backend_shm_region_abc", "1048576"]
    assert own_regions(cmdline) == [SHM_DIR / "triton_python_backend_shm_region_abc"]
    assert own_regions(["stub", "/dev/shm/triton_python_backend_shm_region_x/../../etc"]) == []
    assert ORPHANED_EXIT != 0


# The stub's native lifeline, while another thread holds the GIL for good (``PyDLL`` keeps it over
# libc's sleep): Python's lifeline could not run, the native thread removes the file and exits.
NATIVE_CHILD = """
import ctypes, os, sys
from pathlib import Path
from python_backend.triton.orphan import start_native_lifeline
marker = Path(sys.argv[1])
marker.write_text("alive")
if not start_native_lifeline(os.getppid(), [marker], "the test's parent"):
    sys.exit(7)
ctypes.PyDLL(None).sleep(600)
"""


def test_the_native_lifeline_ends_a_process_whose_gil_is_held(tmp_path: Path) -> None:
    if start_native_lifeline_unavailable():
        pytest.skip("no C compiler: the stub keeps Python's lifeline")
    marker = tmp_path / "alive"
    with parent_and_child(PARENT, NATIVE_CHILD, str(marker)) as (parent, child):
        _armed(child, marker)
        time.sleep(0.5)  # the child reaches its GIL-holding sleep (no event to wait on there)
        assert child.is_running()
        kill_outright(parent)
        child.wait(EXIT_WAIT_S)  # raises psutil.TimeoutExpired if it stays
        assert not marker.exists()


def start_native_lifeline_unavailable() -> bool:
    return build_library(NATIVE_SOURCE, extra_flags=("-pthread",)) is None


# The native lifeline's exit() half alone (the watching thread not started): Triton's stub ends
# itself with exit(1) once its tritonserver is gone, and on a busy host that can come before the
# thread runs. ``{wait}`` is the child's code between arming and exiting.
AT_EXIT_CHILD = """
import ctypes, os, sys, time
from pathlib import Path
from python_backend.cpu.native.build import build_library
from python_backend.triton.orphan import NATIVE_SOURCE
marker = Path(sys.argv[1])
parent = os.getppid()
library = build_library(NATIVE_SOURCE, extra_flags=("-pthread",))
paths = (ctypes.c_char_p * 1)(os.fsencode(marker))
if library.triton_chat_remove_at_exit_if_orphaned(parent, paths, 1) != 0:
    sys.exit(7)
marker.write_text("alive")
{wait}
sys.exit(1)
"""
UNTIL_ORPHANED = """
deadline = time.monotonic() + 10
while os.getppid() == parent:
    if time.monotonic() > deadline:
        sys.exit(8)
    time.sleep(0.02)
"""


def test_an_exit_after_the_parent_is_gone_removes_the_regions(tmp_path: Path) -> None:
    if start_native_lifeline_unavailable():
        pytest.skip("no C compiler: the stub keeps Python's lifeline")
    marker = tmp_path / "alive"
    with parent_and_child(PARENT, AT_EXIT_CHILD.format(wait=UNTIL_ORPHANED), str(marker)) as (parent, child):
        _armed(child, marker)
        kill_outright(parent)
        child.wait(EXIT_WAIT_S)  # raises psutil.TimeoutExpired if it stays
        assert not marker.exists()


def test_an_exit_while_the_parent_lives_keeps_them(tmp_path: Path) -> None:
    if start_native_lifeline_unavailable():
        pytest.skip("no C compiler: the stub keeps Python's lifeline")
    marker = tmp_path / "alive"
    with parent_and_child(PARENT, AT_EXIT_CHILD.format(wait=""), str(marker)) as (parent, child):
        deadline = time.monotonic() + EXIT_WAIT_S
        # Its parent does not reap it: an ended child stays a zombie until the parent goes.
        while child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.05)
        assert parent.poll() is None  # the parent lived through the child's exit()
        assert marker.exists()  # tritonserver's to remove on an orderly stop
