"""Keeping tritonserver's log file under a size, for ``triton-chat serve``.

Owns ``LogRotation``: once the log passes its limit, copy it to ``<log>.1`` (the older copies
move to ``.2`` ... ``.<backups>``, the oldest is dropped) and cut the log itself to empty, as
logrotate's ``copytruncate`` does. tritonserver keeps writing to the descriptor it was started
with, so the file cannot be renamed away; it was opened for appending (``tritonserver.py``),
so its next line lands at the start of the emptied file instead of after a hole. A line written
between the end of the copy and the cut is lost: a window of microseconds, once per rotation.

The copies are made 0600, as the log is: the model's errors may quote a request. Each is written
under a temporary name and renamed into place, so a reader never finds one half written.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("openai_frontend.launcher")

MIB = 1 << 20
DEFAULT_MAX_MB = 100  # `--triton-log-max-mb`
BACKUPS = 2


def backup_path(log: Path, index: int) -> Path:
    return log.with_name(f"{log.name}.{index}")


@dataclass
class LogRotation:
    """Rotates ``path`` by size when ``check`` finds it past ``max_bytes`` (0: never)."""

    path: Path
    max_bytes: int
    backups: int = BACKUPS

    def check(self) -> bool:
        """Rotate now if the log is past its limit; True when it did."""
        if self.max_bytes <= 0:
            return False
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return False
        if size <= self.max_bytes:
            return False
        self._shift()
        first = backup_path(self.path, 1)
        # Copied under another name, then renamed: ``.1`` is never seen half written, and it is
        # 0600 from its first byte.
        partial = first.with_name(f"{first.name}.partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as out, self.path.open("rb") as source:
            shutil.copyfileobj(source, out)
        os.replace(partial, first)
        os.truncate(self.path, 0)
        logger.info("tritonserver's log passed %d MiB: kept as %s, started afresh", self.max_bytes // MIB, first)
        return True

    def _shift(self) -> None:
        backup_path(self.path, self.backups).unlink(missing_ok=True)
        for index in range(self.backups - 1, 0, -1):
            older = backup_path(self.path, index)
            if older.exists():
                older.replace(backup_path(self.path, index + 1))
