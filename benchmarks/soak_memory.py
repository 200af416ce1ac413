"""The soak's memory figures: every served process by role, sampled idle and under load.

Owns ``served_processes`` (the launcher with the frontend, tritonserver, and each model stub:
``stub``, then ``stub-2``... by PID when Triton runs several instances), ``ProcessSample`` (one
process at one idle moment), ``PeakRss`` (the highest resident memory of each process while a
load runs, sampled every second on a thread) and ``RssTrend`` (resident MiB of each process at
each idle checkpoint, with its time, and the growth per 10 minutes over the whole soak and over
its second half, less the prefix cache that fills to its budget: a leak keeps its slope, an
allocator that warms up flattens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import psutil

from benchmarks.servers import PeriodicSampler
from openai_frontend.launcher.tritonserver import STUB_NAME

MIB = 1 << 20
PEAK_INTERVAL_S = 1.0
TEN_MINUTES_S = 600.0


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    rss_bytes: int
    open_files: int
    threads: int
    # What the process holds on purpose and bounds itself: the stub's prefix cache fills up to its
    # budget (cached prompts and finished answers, for later turns) before it evicts anything.
    cache_bytes: int = 0

    @property
    def unaccounted_bytes(self) -> int:
        return self.rss_bytes - self.cache_bytes


def served_processes(launcher_pid: int) -> dict[str, psutil.Process]:
    """The launcher (with the frontend), tritonserver and the model's stubs, by role."""
    root = psutil.Process(launcher_pid)
    found = {"launcher": root}
    stubs: list[psutil.Process] = []
    for child in root.children(recursive=True):
        name = Path((child.cmdline() or [child.name()])[0]).name
        if name == "tritonserver":
            found["tritonserver"] = child
        elif name == STUB_NAME:
            stubs.append(child)
    for index, stub in enumerate(sorted(stubs, key=lambda proc: proc.pid)):
        found["stub" if index == 0 else f"stub-{index + 1}"] = stub
    return found


def stub_names(processes: dict[str, object]) -> list[str]:
    return [name for name in processes if name == "stub" or name.startswith("stub-")]


def sample_processes(launcher_pid: int, cache_bytes: int) -> dict[str, ProcessSample]:
    """Each served process now; ``cache_bytes`` (the prefix-cache gauge, summed over the model's
    instances) is shared evenly among the stubs, as Triton spreads the requests over them."""
    processes = served_processes(launcher_pid)
    stubs = stub_names(processes)
    share = cache_bytes // max(len(stubs), 1)
    return {
        name: ProcessSample(
            proc.pid, proc.memory_info().rss, proc.num_fds(), proc.num_threads(), share if name in stubs else 0
        )
        for name, proc in processes.items()
    }


@dataclass
class PeakRss(PeriodicSampler):
    """The highest resident bytes of each served process while the ``with`` block runs."""

    launcher_pid: int
    interval_s: float = PEAK_INTERVAL_S
    peaks: dict[str, int] = field(default_factory=dict)

    def sample(self) -> None:
        try:
            processes = served_processes(self.launcher_pid)
        except psutil.Error:
            return  # the server is gone: the soak's own checks say so
        for name, proc in processes.items():
            try:
                rss = proc.memory_info().rss
            except psutil.Error:
                continue
            self.peaks[name] = max(self.peaks.get(name, 0), rss)


@dataclass
class RssTrend:
    """Resident MiB of each process at each idle checkpoint, and the same less the prefix cache
    (``unaccounted_mib``); ``times_s`` from the first checkpoint."""

    times_s: list[float] = field(default_factory=list)
    mib: dict[str, list[float]] = field(default_factory=dict)
    unaccounted_mib: dict[str, list[float]] = field(default_factory=dict)

    def add(self, at_s: float, samples: dict[str, ProcessSample]) -> None:
        self.times_s.append(round(at_s, 1))
        for name, sample in samples.items():
            self.mib.setdefault(name, []).append(round(sample.rss_bytes / MIB, 1))
            self.unaccounted_mib.setdefault(name, []).append(round(sample.unaccounted_bytes / MIB, 1))

    def _first(self, second_half: bool) -> int:
        return (len(self.times_s) - 1) // 2 if second_half else 0

    def growth(self, second_half: bool = False) -> dict[str, float]:
        """Relative growth, less the prefix cache, from the first checkpoint (or the middle one)
        to the last."""
        if len(self.times_s) < 2:
            return {}
        first = self._first(second_half)
        return {
            name: values[-1] / values[first] - 1
            for name, values in self.unaccounted_mib.items()
            if len(values) == len(self.times_s) and values[first] > 0
        }

    def per_10min(self, second_half: bool = False) -> dict[str, float]:
        """MiB of growth per 10 minutes, less the prefix cache, from the first checkpoint (or the
        middle one) to the last."""
        if len(self.times_s) < 2:
            return {}
        first = self._first(second_half)
        span = self.times_s[-1] - self.times_s[first]
        if span <= 0:
            return {}
        return {
            name: round((values[-1] - values[first]) * TEN_MINUTES_S / span, 2)
            for name, values in self.unaccounted_mib.items()
            if len(values) == len(self.times_s)
        }
