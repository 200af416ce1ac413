"""Reading tritonserver's log for the user: the one line that says why it failed, without its noise.

Owns ``failure_summary`` (what a failed start reports: the model's own load error when the log
has one, else the end of the log), ``last_lines`` (the end worth reading) and ``is_noise``, the lines tritonserver writes on every CPU
machine that look like errors and are not ("Error: Failed to initialize NVML", DCGM, pinned
memory), which would otherwise be read as the cause.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from pathlib import Path

# Written by a GPU build of tritonserver wherever there is no NVIDIA driver; harmless on CPU.
NOISE = (
    "Failed to initialize NVML",
    "DCGM unable to start",
    "CudaDriverHelper has not been initialized",
    "Unable to allocate pinned system memory",
    "CUDA memory pool disabled",
)
# Triton's model-lifecycle line; the message's first line is the exception, then "\n\nAt:" and a
# traceback, written escaped inside the quoted message.
_LOAD_FAILURE = re.compile(r"failed to load '(?P<model>[^']+)' version \d+: (?P<message>.*)")
_ESCAPED_NEWLINE = "\\n"
TAIL_LINES = 15
TAIL_LINE_CHARS = 400  # a load error's line holds its whole traceback, escaped


def is_noise(line: str) -> bool:
    return any(marker in line for marker in NOISE)


def load_error(lines: Iterable[str]) -> str | None:
    """The first line of the model's load error, if the log reports one."""
    for line in lines:
        found = _LOAD_FAILURE.search(line)
        if found:
            message = found.group("message").split(_ESCAPED_NEWLINE, 1)[0].rstrip('"').strip()
            return f"the model '{found.group('model')}' failed to load: {message}"
    return None


def last_lines(log_path: Path, count: int) -> str:
    """The log's last ``count`` lines worth reading after a failed start: without the noise, the
    blank lines and Triton's status tables (their rows start with '|' or '+'), each cut to
    ``TAIL_LINE_CHARS``."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            kept = deque(
                (line.rstrip() for line in log if line.strip() and line[:1] not in "|+" and not is_noise(line)),
                maxlen=count,
            )
    except FileNotFoundError:
        return "(no tritonserver log)"
    return "\n".join(line if len(line) <= TAIL_LINE_CHARS else line[:TAIL_LINE_CHARS] + " ..." for line in kept)


def failure_summary(log_path: Path) -> str:
    """What to tell the user about a start that failed, ending with where the full log is."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return "(no tritonserver log)"
    error = load_error(lines)
    if error is not None:
        return f"{error} (full log: {log_path})"
    kept = [line for line in lines if not is_noise(line)][-TAIL_LINES:]
    return "\n".join([*kept, f"(full log: {log_path})"])
