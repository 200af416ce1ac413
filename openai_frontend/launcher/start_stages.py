"""The start a person can watch: ``triton-chat serve``'s stage lines, each with the time since start.

Owns ``StageReport`` (the stage lines, and on a terminal a live status line with a progress bar),
``EventFile`` (reading the start events other processes append) and ``following`` (a thread that
feeds those events to the report while the launcher waits for a child).

The stages that happen elsewhere (the demo conversion in a child process; weight loading and the
CPU kernel build in the Python-backend stub, whose output goes to tritonserver's log) reach the
launcher as ``protocol.start_events``: the launcher names a file of its private run folder in
``START_EVENTS_ENV`` for the child or tritonserver, the model's code appends one JSON line per
event, and ``following`` reads what was added every ``POLL_INTERVAL_S``. Chosen over reading
tritonserver's log: that log mixes Triton's, tqdm's and every logger's free-form lines, its
format is nobody's contract, and it is cut short by rotation; the events file has one format,
defined next to the code that writes it, and nothing else writes to it. Each event carries its
own wall-clock time, so the elapsed times shown do not depend on when the launcher looked.

On a terminal (stderr a TTY, text log format, info level) the active stage is also drawn as a
status line below the log lines (``TerminalHandler``): a bar where the fraction is known, else
the seconds counting. Elsewhere (CI, a file, JSON logs) there are only whole lines, without
control characters, and a long stage with a known fraction says how far it is every
``PLAIN_PROGRESS_INTERVAL_S``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from openai_frontend.launcher.log_format import TerminalHandler, terminal_handler
from python_backend.protocol.start_events import (
    BEGIN,
    CONVERSION,
    END,
    FAILED,
    KERNEL,
    PROGRESS,
    WEIGHTS,
    StartEvent,
    StartEventError,
)

POLL_INTERVAL_S = 0.2
PLAIN_PROGRESS_INTERVAL_S = 10.0
BAR_WIDTH = 24

# What each stage is called while it runs; its begin and end lines.
ACTIVE = {CONVERSION: "converting the demo model", WEIGHTS: "loading weights", KERNEL: "building CPU kernel"}
BEGIN_LINES = {WEIGHTS: "loading weights ({detail})"}  # a kernel's build shows only its end line
END_LINES = {
    WEIGHTS: "weights loaded ({detail}, {seconds:.1f} s)",
    KERNEL: "built CPU kernel {detail} ({seconds:.1f} s)",
}
FAILED_LINES = {
    WEIGHTS: "loading weights failed ({detail})",
    KERNEL: "CPU kernel not built ({detail}); the model runs without it",
}


def stage_prefix(elapsed: float) -> str:
    """``[  12.3s]``: the seconds since the launcher started, aligned up to 99999 s."""
    return f"[{elapsed:7.1f}s]"


def progress_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """``[#########---------------]  38%``"""
    fraction = min(max(fraction, 0.0), 1.0)
    done = int(fraction * width)
    return f"[{'#' * done}{'-' * (width - done)}] {fraction * 100:3.0f}%"


@dataclass
class _Active:
    label: str
    since: float  # wall clock
    fraction: float | None = None
    detail: str = ""
    shown_fraction: float | None = None  # what the last plain progress line said
    shown_at: float = 0.0  # wall clock of the last line about it


@dataclass
class StageReport:
    """The stage lines of one start, through ``logger``; a live status line when ``terminal`` is given."""

    logger: logging.Logger
    started: float = field(default_factory=time.time)  # wall clock: the events' times are wall clock
    terminal: TerminalHandler | None = None
    clock: Callable[[], float] = time.time
    _active: dict[tuple[str, int], _Active] = field(default_factory=dict)
    _waiting: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def for_logger(cls, logger: logging.Logger) -> StageReport:
        """A report whose live status line is drawn where ``logger``'s lines go, if that is a terminal."""
        terminal = terminal_handler(logger) if logger.isEnabledFor(logging.INFO) else None
        return cls(logger, terminal=terminal)

    def line(self, text: str, at: float | None = None) -> None:
        """One stage line: ``[ elapsed] text``."""
        elapsed = (self.clock() if at is None else at) - self.started
        self.logger.info("%s %s", stage_prefix(max(elapsed, 0.0)), text)

    def waiting(self, label: str) -> None:
        """What the status line says while no stage of another process is active ('' for nothing)."""
        with self._lock:
            self._waiting = label
            self._draw(self.clock())

    def take(self, events: list[StartEvent]) -> None:
        """Show ``events`` (from ``EventFile.read_new``) as lines and status."""
        with self._lock:
            for event in events:
                self._take(event)
            self._draw(self.clock())

    def _take(self, event: StartEvent) -> None:
        key = (event.stage, event.pid)
        values = {"detail": event.detail, "seconds": event.seconds or 0.0}
        if event.phase == BEGIN:
            label = ACTIVE.get(event.stage, event.stage)
            label = f"{label} {event.detail}" if event.stage == KERNEL else label
            self._active[key] = _Active(label, event.at, shown_at=event.at)
            template = BEGIN_LINES.get(event.stage)
            if template is not None:
                self.line(template.format(**values), event.at)
            return
        if event.phase == PROGRESS:
            label = ACTIVE.get(event.stage, event.stage)
            active = self._active.setdefault(key, _Active(label, event.at, shown_at=event.at))
            active.fraction, active.detail = event.fraction, event.detail
            return
        self._active.pop(key, None)
        templates = END_LINES if event.phase == END else FAILED_LINES if event.phase == FAILED else {}
        template = templates.get(event.stage)
        text = template.format(**values) if template is not None else f"{event.stage} {event.phase} ({event.detail})"
        self.line(text, event.at)

    def tick(self) -> None:
        """Redraw the status line (the seconds move on); off a terminal, say how far a long stage is."""
        with self._lock:
            now = self.clock()
            if self.terminal is None:
                self._plain_progress(now)
            self._draw(now)

    def _plain_progress(self, now: float) -> None:
        for active in self._active.values():
            if active.fraction is None or active.fraction == active.shown_fraction:
                continue
            if now - active.shown_at >= PLAIN_PROGRESS_INTERVAL_S:
                active.shown_fraction, active.shown_at = active.fraction, now
                detail = f" ({active.detail})" if active.detail else ""
                self.line(f"{active.label}: {active.fraction * 100:.0f}%{detail}", now)

    def _draw(self, now: float) -> None:
        if self.terminal is None:
            return
        self.terminal.set_status(self.status(now))

    def status(self, now: float) -> str:
        """The live status line: the latest active stage (a bar if its fraction is known), else what is awaited."""
        elapsed = stage_prefix(max(now - self.started, 0.0))
        if self._active:
            active = max(self._active.values(), key=lambda a: a.since)
            bar = f" {progress_bar(active.fraction)}" if active.fraction is not None else ""
            detail = f" {active.detail}" if active.detail else ""
            return f"{elapsed} {active.label}{bar}{detail}"
        return f"{elapsed} {self._waiting} ..." if self._waiting else ""

    def done(self) -> None:
        """The waiting is over: no status line any more (what was still active was cut short)."""
        with self._lock:
            self._active.clear()
            self._waiting = ""
            if self.terminal is not None:
                self.terminal.set_status("")

    def start_failed(self, what: str, log_path: Path, tail: str) -> None:
        """A failed start: why, then where tritonserver's log is and its last lines."""
        self.done()
        elapsed = stage_prefix(max(self.clock() - self.started, 0.0))
        self.logger.error("%s start failed: %s", elapsed, what)
        lines = tail.rstrip("\n").splitlines()
        shown = "\n".join(f"  {line}" for line in lines) if lines else "  (empty)"
        self.logger.error("tritonserver's log is %s; its last lines:\n%s", log_path, shown)


@dataclass
class EventFile:
    """The start events appended to ``path``, read in order, each once; a line still being
    written waits for its newline."""

    path: Path
    logger: logging.Logger
    _offset: int = 0
    _partial: bytes = b""

    def read_new(self) -> list[StartEvent]:
        try:
            with open(self.path, "rb") as events:
                events.seek(self._offset)
                data = events.read()
        except FileNotFoundError:
            return []  # nothing written yet
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        found = []
        for raw in lines:
            try:
                found.append(StartEvent.from_line(raw.decode("utf-8", "replace")))
            except StartEventError as exc:
                self.logger.warning("ignoring a line of %s: %s", self.path, exc)
        return found


@contextlib.contextmanager
def following(report: StageReport, events: EventFile, waiting: str) -> Iterator[None]:
    """While the block runs, show the events appended to ``events`` and keep the status line
    moving; ``waiting``: what the status line says meanwhile. The last events are shown before
    the block's caller goes on, so a line logged after it comes after them."""
    stop = threading.Event()

    def follow() -> None:
        while not stop.wait(POLL_INTERVAL_S):
            report.take(events.read_new())
            report.tick()

    report.waiting(waiting)
    thread = threading.Thread(target=follow, name="start-stages", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        report.take(events.read_new())
        report.done()
