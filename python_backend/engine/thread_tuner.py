"""How many OpenMP threads the engine's decode steps use: the count that is fastest right now.

Owns ``TunerPolicy`` (how often and how long to probe, how much faster another count must be),
``ThreadTuner`` (pure logic, no torch: fed the time of each decode step and the thread count it
ran with, it says which count the next step uses) and ``ComputeTeam`` (on the engine thread: sets
that count around each decode step and times the step).

Why: a decode step is about a thousand small parallel regions, each ending at a barrier where the
team's threads wait for one another. When another process takes the core of one of them, every
region waits until that thread is scheduled again, and the team runs far slower than one thread
with a core to itself. So every few seconds under load the tuner runs a probe: decode steps
alternate between the current count and one thread fewer (or one more, once it has gone down),
and the faster by a clear margin is kept. A probe ends at the first step that is much slower than
the current count's, so probing beside a busy neighbour costs one slow step; probes that change
nothing come less and less often (up to ``max_interval_s``, or longer after a costly one, so that
probing takes a bounded share of the time), and a run of steps far slower than at the last probe
(a neighbour arrived) starts one at once. Idle, nothing runs: the tuner only acts when a step is
timed.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TunerPolicy:
    """When the tuner probes, and what makes another thread count win."""

    probe_steps: int = 3  # decode steps timed with each count in a probe (their medians compare)
    margin: float = 0.1  # another count must be this much faster per step to be taken
    abort_ratio: float = 1.5  # a probe step this many times the current count's median ends the probe
    surge_ratio: float = 2.0  # steps this many times slower than at the last probe ...
    surge_steps: int = 3  # ... this many in a row, at about the same batch size, start a probe now
    first_interval_s: float = 2.0  # from the start, and after a switch: the next probe
    max_interval_s: float = 8.0  # probes that change nothing double the wait, up to this
    loss_share: float = 0.05  # ... or wait long enough that a costly losing probe took this share
    longest_wait_s: float = 60.0  # ... but never longer than this

    def __post_init__(self) -> None:
        if self.probe_steps < 1 or self.surge_steps < 1:
            raise ValueError("probe_steps and surge_steps must be >= 1")
        if not -1.0 <= self.margin < 1.0 or self.abort_ratio <= 1.0 or self.surge_ratio <= 1.0:
            raise ValueError("margin must be in [-1, 1), abort_ratio and surge_ratio > 1")
        if not 0.0 <= self.first_interval_s <= self.max_interval_s <= self.longest_wait_s:
            raise ValueError("intervals must satisfy 0 <= first_interval_s <= max_interval_s <= longest_wait_s")
        if not 0.0 < self.loss_share <= 1.0:
            raise ValueError("loss_share must be in (0, 1]")


@dataclass
class _Probe:
    candidate: int
    current: list[float] = field(default_factory=list)  # step seconds with the chosen count
    tried: list[float] = field(default_factory=list)  # step seconds with the candidate
    rows: int = 0  # the batch size of the probe's last step


class ThreadTuner:
    """Chooses the engine's thread count from the decode steps' own timings.

    The caller asks ``next_step()`` before each decode step, runs the step with that many
    threads and reports it with ``observe``; ``threads`` is the count chosen for everything else.
    """

    def __init__(
        self,
        max_threads: int,
        min_threads: int = 1,
        policy: TunerPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= min_threads <= max_threads:
            raise ValueError(f"need 1 <= min_threads <= max_threads, got {min_threads} and {max_threads}")
        self._policy = policy or TunerPolicy()
        self._clock = clock
        self._min, self._max = min_threads, max_threads
        self._chosen = max_threads
        self._interval = self._policy.first_interval_s
        self._next_probe_at = clock() + self._interval
        self._probe: _Probe | None = None
        self._downward = True  # the direction the next probe tries first
        self._reference: tuple[int, float] | None = None  # (rows, step s) of the chosen count
        self._surges = 0
        self.switches = 0  # how often the chosen count changed

    @property
    def threads(self) -> int:
        """The chosen count: what prefill and every step outside a probe run with."""
        return self._chosen

    def next_step(self) -> int:
        """The thread count the next decode step runs with."""
        if self._probe is None:
            if self._clock() < self._next_probe_at:
                return self._chosen
            candidate = self._candidate()
            if candidate is None:
                self._next_probe_at = float("inf")  # a single possible count: nothing to compare
                return self._chosen
            self._probe = _Probe(candidate)
        probe = self._probe
        # Alternate, the chosen count first: the candidate's first step then has a reference.
        return probe.candidate if len(probe.current) > len(probe.tried) else self._chosen

    def observe(self, threads: int, rows: int, seconds: float) -> None:
        """A decode step of ``rows`` sequences took ``seconds`` with ``threads`` threads."""
        probe = self._probe
        if probe is None:
            if threads == self._chosen:
                self._watch(rows, seconds)
            return
        if threads == probe.candidate:
            probe.tried.append(seconds)
        elif threads == self._chosen:
            probe.current.append(seconds)
        else:
            return
        probe.rows = rows
        if not (probe.current and probe.tried):
            return
        policy = self._policy
        current = statistics.median(probe.current)
        if probe.tried[-1] > policy.abort_ratio * current:
            self._finish(probe, wins=False)
        elif len(probe.tried) >= policy.probe_steps and len(probe.current) >= policy.probe_steps:
            self._finish(probe, wins=statistics.median(probe.tried) < (1.0 - policy.margin) * current)

    def _candidate(self) -> int | None:
        down = self._chosen - 1 if self._chosen > self._min else None
        up = self._chosen + 1 if self._chosen < self._max else None
        first, second = (down, up) if self._downward else (up, down)
        return first if first is not None else second

    def _finish(self, probe: _Probe, wins: bool) -> None:
        current = statistics.median(probe.current)
        tried = statistics.median(probe.tried)
        downward = probe.candidate < self._chosen
        logger.debug(
            "thread probe: %d threads %.1f ms/step, %d threads %.1f ms/step (batch %d): %s",
            self._chosen,
            current * 1e3,
            probe.candidate,
            tried * 1e3,
            probe.rows,
            "switching" if wins else "staying",
        )
        if wins:
            self._chosen = probe.candidate
            self.switches += 1
            self._interval = self._policy.first_interval_s
            self._downward = downward  # keep going the way that helped
            self._reference = (probe.rows, tried)
        else:
            # On a crowded machine a step with one more thread can take ten times as long: the
            # wait then grows so that probing costs at most loss_share of the time.
            policy = self._policy
            cost = sum(max(seconds - current, 0.0) for seconds in probe.tried)
            waits = (
                min(2 * self._interval, policy.max_interval_s),
                min(cost / policy.loss_share, policy.longest_wait_s),
            )
            self._interval = max(waits)
            self._downward = not downward
            self._reference = (probe.rows, current)
        self._probe = None
        self._surges = 0
        self._next_probe_at = self._clock() + self._interval

    def _watch(self, rows: int, seconds: float) -> None:
        """Between probes: a run of steps much slower than at the last probe starts one now."""
        if self._reference is None:
            return
        ref_rows, ref_seconds = self._reference
        if abs(rows - ref_rows) > max(1, ref_rows // 4):
            return  # another batch size: its steps take another time, so they say nothing
        if seconds <= self._policy.surge_ratio * ref_seconds:
            self._surges = 0
            return
        self._surges += 1
        if self._surges >= self._policy.surge_steps:
            logger.debug("decode steps %.1fx slower than at the last probe: probing now", seconds / ref_seconds)
            self._surges = 0
            self._interval = self._policy.first_interval_s
            self._next_probe_at = self._clock()


class ComputeTeam:
    """The engine thread's team size around each decode step: fixed, or chosen by a ``ThreadTuner``.

    ``set_threads`` is what changes the calling thread's team size (``torch.set_num_threads``);
    it is called only when the count changes.
    """

    def __init__(
        self,
        threads: int,
        set_threads: Callable[[int], None],
        tuner: ThreadTuner | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._fixed = threads
        self._set_threads = set_threads
        self._tuner = tuner
        self._timer = timer
        self._applied = threads

    @property
    def threads(self) -> int:
        """The count the engine now runs with outside a probe (the engine's stats report it)."""
        return self._tuner.threads if self._tuner is not None else self._fixed

    @property
    def switches(self) -> int:
        return self._tuner.switches if self._tuner is not None else 0

    def _apply(self, threads: int) -> None:
        if threads != self._applied:
            self._set_threads(threads)
            self._applied = threads

    @contextmanager
    def decode(self, rows: int) -> Iterator[None]:
        """Run the decode step of ``rows`` sequences inside this block with the tuner's count."""
        tuner = self._tuner
        if tuner is None or rows == 0:
            yield
            return
        threads = tuner.next_step()
        self._apply(threads)
        started = self._timer()
        yield
        tuner.observe(threads, rows, self._timer() - started)
        self._apply(tuner.threads)  # prefill and the rest run with the chosen count
