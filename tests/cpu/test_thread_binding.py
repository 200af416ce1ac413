"""Pinning the engine's OpenMP team: which CPUs, and that the team's threads really move there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from python_backend.cpu.native.thread_binding import compute_cpus
from python_backend.model.threads import pinned_cpus, use_compute_threads


def _topology(root: Path, cores: dict[int, tuple[int, int]]) -> Path:
    for cpu, (package, core) in cores.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{package}\n")
        (folder / "core_id").write_text(f"{core}\n")
    return root


def test_one_cpu_per_physical_core(tmp_path: Path) -> None:
    # Two cores with two hyperthreads each, enumerated the AMD way (siblings are n and n + 2).
    topology = _topology(tmp_path, {0: (0, 0), 1: (0, 1), 2: (0, 0), 3: (0, 1)})
    assert compute_cpus(2, {0, 1, 2, 3}, topology) == [0, 1]
    assert compute_cpus(3, {0, 1, 2, 3}, topology) is None  # never two threads on one core
    assert compute_cpus(1, {2, 3}, topology) == [2]  # only the CPUs the process may use


def test_without_a_readable_topology_each_cpu_is_a_core(tmp_path: Path) -> None:
    assert compute_cpus(2, {4, 7}, tmp_path / "absent") == [4, 7]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_engine_threads_team_is_pinned_one_thread_per_cpu() -> None:
    cpus = pinned_cpus(2, on_cpu=True, bind=True)
    if cpus is None:
        pytest.skip("fewer than two physical cores")
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the team stays unpinned")
    before = set(os.listdir("/proc/self/task"))
    own: set[int] = set()
    others: list[set[int]] = []

    def engine_thread() -> None:
        use_compute_threads(2, cpus)
        torch.ones(1 << 22).mul_(2).sum()  # a parallel region on this thread's team
        own.update(os.sched_getaffinity(0))
        # The team's other thread lives as long as this one (libgomp's pool is per thread).
        new = set(os.listdir("/proc/self/task")) - before
        others.extend(os.sched_getaffinity(int(tid)) for tid in new if int(tid) != threading.get_native_id())

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join(60)
    assert own == {cpus[0]}
    assert {cpus[1]} in others
    assert os.sched_getaffinity(0) != {cpus[0]}  # the calling (test) thread is untouched


def test_no_pinning_off_cpu_when_disabled_or_single_threaded() -> None:
    assert pinned_cpus(2, on_cpu=False, bind=True) is None
    assert pinned_cpus(2, on_cpu=True, bind=False) is None
    assert pinned_cpus(1, on_cpu=True, bind=True) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_confining_moves_every_thread_of_the_process() -> None:
    # In a child process: it pins the whole process, which must not leak into this one.
    script = (
        "import os, threading, time\n"
        "from python_backend.model.threads import confine_serving_threads\n"
        "stop = threading.Event()\n"
        "helper = threading.Thread(target=stop.wait)\n"
        "helper.start()\n"
        "cpu = max(os.sched_getaffinity(0))\n"
        "confine_serving_threads(cpu)\n"
        "later = threading.Thread(target=stop.wait)\n"
        "later.start()\n"
        "tasks = os.listdir('/proc/self/task')\n"
        "print(all(os.sched_getaffinity(int(t)) == {cpu} for t in tasks), len(tasks))\n"
        "stop.set()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    confined, tasks = done.stdout.split()
    assert confined == "True" and int(tasks) >= 3  # main, helper, later (and whatever torch started)
