"""The model process's glibc heap keeps what a serving step frees, up to its cap (model/allocator.py)."""

from __future__ import annotations

import gc
import json
import platform
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from python_backend.model.allocator import (
    HeapKeeper,
    HeapPolicy,
    HeapUsage,
    freeze_startup_objects,
    keep_freed_memory,
    user_tuned,
)
from python_backend.protocol.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[2]
PAGES = 3 * (24 << 20) // resource.getpagesize()  # one round's pages

# A step's worth of buffers: three 24 MiB blocks allocated, written and freed, round after round.
# glibc's defaults return them to the kernel on each free (the top of the heap is trimmed), so
# every round faults all 18,432 pages in again; a heap that keeps freed memory faults them once.
ROUNDS = """
import ctypes, json, resource, sys
from python_backend.model.allocator import HeapPolicy, keep_freed_memory, release_freed_memory
applied = keep_freed_memory(HeapPolicy.capped_mb(512), environ={}) if sys.argv[1] == "keep" else False
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size, blocks, faults = 24 << 20, [0, 0, 0], [0] * 4
for round in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(3):
        blocks[i] = libc.malloc(size)
        ctypes.memset(blocks[i], 1, size)
    faults[round] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    for block in blocks:
        libc.free(block)
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
kept = resident()
released = release_freed_memory() if applied else False
print(json.dumps({"applied": applied, "faults": faults, "kept": kept, "released": released, "after": resident()}))
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")


def _rounds(mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", ROUNDS, mode], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@glibc_only
def test_buffers_freed_by_one_step_are_reused_by_the_next_without_page_faults() -> None:
    kept = _rounds("keep")
    assert kept["applied"] is True
    faults = kept["faults"]
    assert isinstance(faults, list)
    assert faults[0] >= PAGES // 2  # the first round writes fresh memory
    assert all(later < PAGES // 20 for later in faults[1:]), faults


@glibc_only
def test_without_it_each_round_faults_its_buffers_in_again() -> None:
    """The cost the policy removes, so that the test above cannot pass on a heap that always reuses."""
    faults = _rounds("default")["faults"]
    assert isinstance(faults, list)
    assert sum(faults[1:]) >= 3 * PAGES // 2, faults


@glibc_only
def test_what_was_kept_goes_back_to_the_system_when_released() -> None:
    """What the engine does when it goes idle: the last burst's 72 MiB stop being resident."""
    kept = _rounds("keep")
    assert kept["released"] is True
    assert isinstance(kept["kept"], int) and isinstance(kept["after"], int)
    assert kept["kept"] - kept["after"] >= 48 << 20, kept


@pytest.mark.parametrize(
    "environ",
    [
        {"MALLOC_TRIM_THRESHOLD_": "0"},
        {"MALLOC_ARENA_MAX": "2"},
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"},
        {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2:glibc.malloc.trim_threshold=0"},
    ],
)
def test_the_users_own_malloc_settings_are_kept(environ: dict[str, str]) -> None:
    assert user_tuned(environ)
    assert keep_freed_memory(HeapPolicy.capped_mb(512), environ=environ) is False


def test_other_tunables_do_not_count_as_malloc_settings() -> None:
    assert not user_tuned({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2", "MALLOC_CHECK": "1"})
    assert not user_tuned({})


def test_the_setting_is_on_by_default_and_can_be_turned_off() -> None:
    assert EngineSettings.from_parameters({"model_path": "m"}).cpu_keep_freed_memory is True
    off = EngineSettings.from_parameters({"model_path": "m", "cpu_keep_freed_memory": "false"})
    assert off.cpu_keep_freed_memory is False


def test_the_cap_is_a_setting_of_512_mib_by_default() -> None:
    assert EngineSettings.from_parameters({"model_path": "m"}).cpu_keep_freed_memory_mb == 512
    small = EngineSettings.from_parameters({"model_path": "m", "cpu_keep_freed_memory_mb": "64"})
    policy = HeapPolicy.capped_mb(small.cpu_keep_freed_memory_mb)
    # glibc trims the heap's top above the cap itself, and pads it by no more than the cap.
    assert (policy.keep_cap, policy.trim_threshold, policy.pad) == (64 << 20, 64 << 20, 64 << 20)
    assert HeapPolicy.capped_mb(4096).trim_threshold == (1 << 31) - 1  # mallopt takes an int


MIB = 1 << 20


class FakeHeap:
    """A heap whose figures the test sets; ``trim`` gives back what it keeps, as malloc_trim does."""

    def __init__(self, outside: int) -> None:
        self.outside = outside  # resident outside the heap: weights, Python's arenas, libraries
        self.in_use = 0
        self.kept = 0  # freed, still resident
        self.trims = 0

    def usage(self) -> HeapUsage:
        return HeapUsage(self.outside + self.in_use + self.kept, self.in_use)

    def trim(self) -> bool:
        self.trims += 1
        released, self.kept = self.kept > 0, 0
        return released


def _keeper(heap: FakeHeap, now: list[float], cap: int = 100 * MIB) -> HeapKeeper:
    return HeapKeeper(cap, heap, clock=lambda: now[0], interval_s=1.0)


def test_a_spike_over_the_cap_is_given_back_at_the_next_check() -> None:
    heap, now = FakeHeap(outside=300 * MIB), [0.0]
    keeper = _keeper(heap, now)
    assert heap.trims == 1  # start-up's freed memory, and the first measure of what is outside
    heap.in_use, heap.kept = 900 * MIB, 0  # a load spike: the batch's buffers in use
    heap.in_use, heap.kept = 200 * MIB, 700 * MIB  # most of it freed, kept by the heap
    now[0] = 1.5
    keeper.after_pass()
    assert (heap.kept, keeper.trims, heap.usage().resident) == (0, 1, 500 * MIB)


def test_what_the_heap_keeps_under_the_cap_stays_for_the_next_steps() -> None:
    heap, now = FakeHeap(outside=300 * MIB), [0.0]
    keeper = _keeper(heap, now)
    heap.in_use, heap.kept = 200 * MIB, 90 * MIB
    for step in range(1, 6):
        now[0] = float(step)
        keeper.after_pass()
    assert (heap.kept, keeper.trims, heap.trims) == (90 * MIB, 0, 1)


def test_the_heap_is_read_at_most_once_an_interval() -> None:
    heap, now = FakeHeap(outside=300 * MIB), [0.0]
    keeper = _keeper(heap, now)
    heap.kept = 500 * MIB
    now[0] = 0.9  # steps within the first second: not looked at
    keeper.after_pass()
    assert heap.kept == 500 * MIB
    now[0] = 1.0
    keeper.after_pass()
    assert heap.kept == 0
    heap.kept = 500 * MIB
    now[0] = 1.5
    keeper.after_pass()
    assert heap.kept == 500 * MIB and keeper.trims == 1


def test_growth_outside_the_heap_costs_one_give_back_not_one_a_second() -> None:
    heap, now = FakeHeap(outside=300 * MIB), [0.0]
    keeper = _keeper(heap, now)
    heap.outside += 400 * MIB  # e.g. the weights' pages read in: no trim can shrink them
    for step in range(1, 11):
        now[0] = float(step)
        keeper.after_pass()
    assert keeper.trims == 1 and keeper.kept() == 0


def test_idle_gives_back_everything_kept() -> None:
    heap, now = FakeHeap(outside=300 * MIB), [0.0]
    keeper = _keeper(heap, now)
    heap.kept = 50 * MIB  # under the cap: kept while requests run
    assert keeper.release() is True
    assert heap.kept == 0 and keeper.trims == 0  # idle give-backs are not cap trims


# A load spike in glibc's real heap: blocks allocated, written and freed in front of one block still
# in use, so the freed memory sits inside the heap, below its top, where glibc's own trimming of
# the top never reaches. With the cap 64 MiB, 192 MiB freed is given back at the keeper's next
# check; 32 MiB freed stays for reuse.
SPIKE = """
import ctypes, json, sys
from python_backend.model.allocator import GlibcHeap, HeapKeeper, HeapPolicy, keep_freed_memory
cap, blocks, size = 64 << 20, int(sys.argv[1]), 16 << 20
applied = keep_freed_memory(HeapPolicy(keep_cap=cap), environ={})
now = [0.0]
heap = GlibcHeap()
keeper = HeapKeeper(cap, heap, clock=lambda: now[0])
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
spike = [libc.malloc(size) for _ in range(blocks)]
pin = libc.malloc(size)  # still in use after the spike, above it in the heap
for block in [*spike, pin]:
    ctypes.memset(block, 1, size)
for block in spike:
    libc.free(block)
kept, resident = keeper.kept(), heap.usage().resident
now[0] = 0.5
keeper.after_pass()  # within the first interval: not looked at
early = heap.usage().resident
now[0] = 2.0
keeper.after_pass()
after = heap.usage().resident
print(json.dumps({"applied": applied, "kept": kept, "resident": resident, "early": early, "after": after,
                  "trims": keeper.trims, "kept_after": keeper.kept()}))
"""


def _spike(blocks: int) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", SPIKE, str(blocks)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@glibc_only
def test_a_real_spike_over_the_cap_stops_being_resident() -> None:
    run = _spike(12)  # 192 MiB freed inside the heap
    assert run["applied"] is True
    assert run["kept"] >= 160 * MIB, run  # the policy alone keeps it all
    assert run["resident"] - run["early"] < 8 * MIB, run
    assert run["trims"] == 1 and run["resident"] - run["after"] >= 160 * MIB, run
    assert run["kept_after"] <= 64 * MIB, run


@glibc_only
def test_a_real_spike_under_the_cap_is_kept() -> None:
    run = _spike(2)  # 32 MiB freed
    assert run["applied"] is True and run["kept"] >= 24 * MIB, run
    assert run["trims"] == 0 and run["resident"] - run["after"] < 8 * MIB, run


def test_start_up_objects_leave_the_collector_and_later_ones_stay_in_it() -> None:
    startup = {"held": [1, 2, 3]}
    try:
        assert freeze_startup_objects() > 0
        later = {"held": [4, 5, 6]}
        tracked = gc.get_objects()
        # Full collections walk only what was created after start-up.
        assert not any(o is startup for o in tracked)
        assert any(o is later for o in tracked)
    finally:
        gc.unfreeze()
    assert any(o is startup for o in gc.get_objects())
