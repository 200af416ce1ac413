"""Start-up stage events: what the model's process (and the demo conversion) tells the launcher
while it starts, so ``triton-chat serve`` can show the stages on the user's terminal.

Owns the event (``StartEvent``), its wire form (one JSON object per line) and the writer side
(``StageReporter``). The launcher names a file in ``START_EVENTS_ENV``; the writers append lines to
it and the launcher follows it (``openai_frontend.launcher.start_stages``). Without the variable
(a tritonserver started by hand) nothing is written. A file and not the log: tritonserver's log
interleaves free-form lines from Triton, tqdm and every logger, and is cut short by rotation,
while this file has one format, kept here, and one reader. Each event is one ``write`` of a line
opened in append mode, so the lines of several writers (model instances, tensor-parallel ranks)
do not mix.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

logger = logging.getLogger(__name__)

START_EVENTS_ENV = "TRITON_CHAT_START_EVENTS"

# Stages
CONVERSION = "conversion"  # the demo model's GGUF -> safetensors conversion (the launcher's child)
WEIGHTS = "weights"  # the model's weights read onto the device
KERNEL = "kernel"  # one CPU kernel compiled (first start on a machine only)

# Phases
BEGIN = "begin"
PROGRESS = "progress"
END = "end"
FAILED = "failed"
PHASES = (BEGIN, PROGRESS, END, FAILED)

# Progress is written at most this often: a weight load reports per tensor, thousands of them.
PROGRESS_INTERVAL_S = 0.25


class StartEventError(ValueError):
    """A line of the events file is not a start event."""


@dataclass(frozen=True)
class StartEvent:
    """One thing that happened while starting. ``at``: ``time.time()`` when it happened (the
    launcher counts the elapsed time from its own start); ``fraction``: 0..1 of a stage's work,
    when known; ``seconds``: how long the stage took (``END``, ``FAILED``)."""

    stage: str
    phase: str
    at: float
    detail: str = ""
    fraction: float | None = None
    seconds: float | None = None
    pid: int = 0

    def to_line(self) -> str:
        fields = {key: value for key, value in asdict(self).items() if value not in (None, "")}
        return json.dumps(fields, ensure_ascii=False, separators=(",", ":")) + "\n"

    @classmethod
    def from_line(cls, line: str) -> StartEvent:
        """The event of one line; ``StartEventError`` naming what is wrong otherwise."""
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise StartEventError(f"not JSON: {line[:200]!r}") from exc
        if not isinstance(data, dict):
            raise StartEventError(f"not an object: {line[:200]!r}")
        stage, phase, at = data.get("stage"), data.get("phase"), data.get("at")
        if not isinstance(stage, str) or phase not in PHASES or not isinstance(at, int | float):
            raise StartEventError(f"needs a stage, a phase of {PHASES} and a time: {line[:200]!r}")
        fraction, seconds = data.get("fraction"), data.get("seconds")
        if fraction is not None and not (isinstance(fraction, int | float) and 0 <= fraction <= 1):
            raise StartEventError(f"fraction must be within 0..1: {line[:200]!r}")
        if seconds is not None and not isinstance(seconds, int | float):
            raise StartEventError(f"seconds must be a number: {line[:200]!r}")
        return cls(
            stage=stage,
            phase=str(phase),
            at=float(at),
            detail=str(data.get("detail", "")),
            fraction=None if fraction is None else float(fraction),
            seconds=None if seconds is None else float(seconds),
            pid=int(data.get("pid", 0)) if isinstance(data.get("pid", 0), int) else 0,
        )


def write_event(event: StartEvent, environ: Mapping[str, str] | None = None) -> None:
    """Append ``event`` to the file named in ``START_EVENTS_ENV``; nothing when it names none. A
    file that cannot be written costs the user the stage line, never the start: logged."""
    path = (os.environ if environ is None else environ).get(START_EVENTS_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as events:
            events.write(event.to_line())
    except OSError as exc:
        logger.warning("cannot write the start event to %s: %s", path, exc)


@dataclass
class StageReporter:
    """One stage of one process: ``begin``, ``progress`` (throttled), then ``end`` or ``failed``."""

    stage: str
    environ: Mapping[str, str] | None = None  # None: this process's environment
    started: float = field(default_factory=time.monotonic)
    _last_progress: float = 0.0

    def _write(self, phase: str, detail: str, fraction: float | None = None, seconds: float | None = None) -> None:
        event = StartEvent(self.stage, phase, time.time(), detail, fraction, seconds, os.getpid())
        write_event(event, self.environ)

    def begin(self, detail: str = "") -> None:
        self.started = time.monotonic()
        self._write(BEGIN, detail)

    def progress(self, fraction: float, detail: str = "") -> None:
        """``fraction`` of the stage done; written at most every ``PROGRESS_INTERVAL_S``, and always at 1."""
        now = time.monotonic()
        if fraction < 1 and now - self._last_progress < PROGRESS_INTERVAL_S:
            return
        self._last_progress = now
        self._write(PROGRESS, detail, fraction=min(max(fraction, 0.0), 1.0))

    def end(self, detail: str = "") -> None:
        self._write(END, detail, seconds=time.monotonic() - self.started)

    def failed(self, detail: str) -> None:
        self._write(FAILED, detail, seconds=time.monotonic() - self.started)
