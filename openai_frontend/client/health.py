"""Whether tritonserver answers at all, as this frontend sees it: ``BackendHealth``.

Owns the backend's up/down state and the probe loop that keeps it: every ``interval_s`` a probe
(``ServerLive`` over the frontend's gRPC client, in ``client.triton``) that must answer within
``interval_s``. ``MISSES_TO_DOWN`` probes in a row that fail or go unanswered mark the backend
down (after a miss the next probe runs at once, so a refused connection is down in a fraction of
a second and a stopped server within about that many intervals); the first one that answers
marks it up again. A response on any of the frontend's streams while a probe waits is an answer
too (``heard_from``): on a busy host a probe can wait past its deadline while tritonserver is
plainly serving, and calling that an outage would fail every request in flight. A call that
found tritonserver unreachable (``suspect``) only runs the next probe at once, so a model that is
merely unloading (UNAVAILABLE from a live server) does not count as an outage. Each change is
one warning line and one ``on_change`` call (the metrics); no request logs it again.

While down, ``down_signal`` is a completed future: new requests fail at once (503
``backend_unavailable``), and requests in flight, which wait on it, fail when it completes. A
stopped server (SIGSTOP, a hung host) still accepts connections and never answers, so only the
probe's deadline can tell; a refused connection fails the probe at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from openai_frontend.aio import within

logger = logging.getLogger(__name__)

# Past the probe's own gRPC deadline, for the call to give up: the deadline is the gRPC core's.
PROBE_SLACK_S = 0.5
# Probes in a row that must fail before the backend is down: one late answer on a busy host is
# not an outage, three (with no stream answering meanwhile) are.
MISSES_TO_DOWN = 3
# Between two probes at least: a burst of failing calls asks for one probe, not one each.
MIN_PROBE_GAP_S = 0.05

# ``probe(timeout_s)``: None when tritonserver answered in time, else what went wrong.
Probe = Callable[[float], Awaitable[str | None]]


class BackendHealth:
    """The up/down state of the backend and its probe loop; see the module doc."""

    def __init__(self, probe: Probe, interval_s: float, on_change: Callable[[bool], None] | None = None) -> None:
        """``on_change(up)``: called once per change of state (not for the initial up)."""
        if not interval_s > 0:
            raise ValueError(f"the probe interval must be > 0, got {interval_s}")
        self._probe = probe
        self._interval_s = interval_s
        self._on_change = on_change
        self._up = True  # until a probe says otherwise: the launcher starts us once it is ready
        self._misses = 0  # failed probes in a row
        self._heard = 0.0  # monotonic time of the last response read on any stream
        self._down_since = 0.0
        self._down: asyncio.Future[None] | None = None  # completed while down; created in the loop
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        return self._up

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def down_signal(self) -> asyncio.Future[None]:
        """A future that completes when the backend goes down (already completed while it is).
        Shared by every request: wait on it, never cancel it."""
        if self._down is None:
            self._down = asyncio.get_running_loop().create_future()
            if not self._up:
                self._down.set_result(None)
        return self._down

    def start(self) -> None:
        """Start the probe loop (inside the event loop); the first probe runs at once."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def heard_from(self) -> None:
        """A response from tritonserver arrived on some stream: it answers."""
        self._heard = time.monotonic()

    def suspect(self) -> None:
        """A call found tritonserver unreachable: probe now rather than at the next interval."""
        self._wake.set()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})  # a cancel of the caller propagates (suppressing it would not)
        if not task.cancelled() and task.exception() is not None:
            logger.error("the backend's probe loop had failed", exc_info=task.exception())

    async def check(self) -> None:
        """One probe, and the state it says with the probes before it."""
        started = time.monotonic()
        try:
            problem = await within(self._probe(self._interval_s), self._interval_s + PROBE_SLACK_S)
        except asyncio.TimeoutError:
            problem = f"no answer within {self._interval_s:g} s"
        if problem is not None and self._heard >= started:
            problem = None  # the probe was slow, but a stream got its answer meanwhile
        self._misses = 0 if problem is None else self._misses + 1
        if problem is not None and self._misses < MISSES_TO_DOWN:
            return  # not an outage yet: the loop probes again at once
        self._record(problem)

    async def _run(self) -> None:
        while True:
            await self.check()
            if not (self._up and self._misses):  # after a miss while up: the next probe at once
                with contextlib.suppress(asyncio.TimeoutError):
                    await within(self._wake.wait(), self._interval_s)
            self._wake.clear()
            await asyncio.sleep(MIN_PROBE_GAP_S)

    def _record(self, problem: str | None) -> None:
        if problem is None and not self._up:
            self._up = True
            self._down = None  # the next request waits on a fresh one
            logger.warning(
                "tritonserver answers again after %.1f s: requests go to it again", time.monotonic() - self._down_since
            )
        elif problem is not None and self._up:
            self._up = False
            self._down_since = time.monotonic()
            if self._down is not None and not self._down.done():
                self._down.set_result(None)
            logger.warning(
                "tritonserver is not answering (%s): requests get 503 backend_unavailable until it does "
                "(checked every %g s)",
                problem,
                self._interval_s,
            )
        else:
            return
        if self._on_change is not None:
            self._on_change(self._up)
