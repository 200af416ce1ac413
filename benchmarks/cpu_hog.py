"""A noisy neighbour for a benchmark: N single-threaded processes, each keeping one core busy.

Owns ``CpuHog``, a context manager that starts the processes, waits until each one spins, and
stops them by PID when the block ends. Each process also ends by itself after ``limit_s``, so a
benchmark that dies leaves no busy process behind for long. Also owns what a load beside them is
held to: the targets, ``arrivals_of`` (a request's content chunks as timed ``Arrival``s), and
``recovery_s``, how soon after they end a load's output rate (over a sliding window of its tokens'
arrival times) is back to a given level. ``hog_runs`` runs a load beside them.
"""

from __future__ import annotations

import bisect
import itertools
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from benchmarks.load import RequestResult

# Spins rather than sleeps: the point is to hold a core the way a busy process does.
_BUSY = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "print('busy', flush=True)\n"
    "while time.monotonic() < end:\n"
    "    pass\n"
)
_STOP_TIMEOUT_S = 10.0

# Beside a neighbour: the targets the ratios line checks, and the window the recovery is measured on.
BESIDE_MIN_RATIO = 0.5  # output tok/s beside ÷ alone
BESIDE_MAX_TTFT_P99_RATIO = 3.0  # TTFT p99 beside ÷ alone
RECOVERY_LEVEL = 0.95  # of the first run's output tok/s ...
RECOVERY_LIMIT_S = 10.0  # ... within this long after the neighbours end
RECOVERY_WINDOW_S = 2.0


@dataclass
class CpuHog:
    """``count`` busy processes for the duration of a ``with`` block (at most ``limit_s``)."""

    count: int
    limit_s: float = 1800.0
    _processes: list[subprocess.Popen[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.count < 0 or self.limit_s <= 0:
            raise ValueError(f"need count >= 0 and limit_s > 0, got {self.count} and {self.limit_s}")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.poll() is None]

    def __enter__(self) -> CpuHog:
        try:
            for _ in range(self.count):
                process = subprocess.Popen(
                    [sys.executable, "-c", _BUSY, str(self.limit_s)], stdout=subprocess.PIPE, text=True
                )
                self._processes.append(process)
                # Its first line comes once it runs; EOF ('') if it died first.
                if process.stdout is None or process.stdout.readline().strip() != "busy":
                    raise RuntimeError(f"busy process {process.pid} did not start")
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.kill()
            process.wait(_STOP_TIMEOUT_S)
            if process.stdout is not None:
                process.stdout.close()
        self._processes.clear()


class Arrival(NamedTuple):
    """One content chunk: when it came (``time.perf_counter()``) and the output tokens it stands for."""

    at_s: float
    tokens: float


def arrivals_of(sent_s: float, result: RequestResult) -> list[Arrival]:
    """The content chunks of a request sent at ``sent_s``; its output tokens (the server's usage)
    are spread evenly over them, as a chunk may carry several tokens or none of its own."""
    if not result.ok:
        return []
    stamps = list(itertools.accumulate(result.gaps_s, initial=sent_s + result.ttft_s))
    return [Arrival(stamp, result.tokens / len(stamps)) for stamp in stamps]


def recovery_s(
    arrivals: Sequence[Arrival], since_s: float, target_per_s: float, window_s: float = RECOVERY_WINDOW_S
) -> float | None:
    """Seconds from ``since_s`` to the start of the first ``window_s`` window after it whose output
    rate reaches ``target_per_s``; None when no window does (or there is no target)."""
    if target_per_s <= 0 or window_s <= 0:
        return None
    after = sorted(a for a in arrivals if a.at_s > since_s)
    times = [a.at_s for a in after]
    tokens = list(itertools.accumulate((a.tokens for a in after), initial=0.0))
    need = target_per_s * window_s * (1 - 1e-9)  # shares of a request's tokens add up with rounding
    # The tokens in (start, start + window] grow only as the window's end passes an arrival, so the
    # first start to reach the target is ``since_s`` or an arrival's time less the window.
    for start in (since_s, *(t - window_s for t in times if t - window_s > since_s)):
        inside = tokens[bisect.bisect_right(times, start + window_s)] - tokens[bisect.bisect_right(times, start)]
        if inside >= need:
            return round(start - since_s, 3)
    return None
