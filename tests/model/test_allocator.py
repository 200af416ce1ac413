"""The model process's glibc heap keeps what a serving step frees (model/allocator.py)."""

from __future__ import annotations

import gc
import json
import platform
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from python_backend.model.allocator import freeze_startup_objects, keep_freed_memory, user_tuned
from python_backend.protocol.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[2]
PAGES = 3 * (24 << 20) // resource.getpagesize()  # one round's pages

# A step's worth of buffers: three 24 MiB blocks allocated, written and freed, round after round.
# glibc's defaults return them to the kernel on each free (the top of the heap is trimmed), so
# every round faults all 18,432 pages in again; a heap that keeps freed memory faults them once.
ROUNDS = """
import ctypes, json, resource, sys
from python_backend.model.allocator import keep_freed_memory, release_freed_memory
applied = keep_freed_memory(environ={}) if sys.argv[1] == "keep" else False
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
    assert keep_freed_memory(environ=environ) is False


def test_other_tunables_do_not_count_as_malloc_settings() -> None:
    assert not user_tuned({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2", "MALLOC_CHECK": "1"})
    assert not user_tuned({})


def test_the_setting_is_on_by_default_and_can_be_turned_off() -> None:
    assert EngineSettings.from_parameters({"model_path": "m"}).cpu_keep_freed_memory is True
    off = EngineSettings.from_parameters({"model_path": "m", "cpu_keep_freed_memory": "false"})
    assert off.cpu_keep_freed_memory is False


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
