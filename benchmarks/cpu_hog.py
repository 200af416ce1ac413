"""A noisy neighbour for a benchmark: N single-threaded processes, each keeping one core busy.

Owns ``CpuHog``, a context manager that starts the processes, waits until each one spins, and
stops them by PID when the block ends. Each process also ends by itself after ``limit_s``, so a
benchmark that dies leaves no busy process behind for long.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

# Spins rather than sleeps: the point is to hold a core the way a busy process does.
_BUSY = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "print('busy', flush=True)\n"
    "while time.monotonic() < end:\n"
    "    pass\n"
)
_STOP_TIMEOUT_S = 10.0


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
