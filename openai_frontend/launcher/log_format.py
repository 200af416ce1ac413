"""Log line formats of the launcher and the frontend: plain text, or one JSON object per line.

Owns: ``JsonFormatter`` (``{"time", "level", "logger", "message"}``, plus ``request_id`` on the
lines logged while a request is handled and ``exception`` with the traceback when there is one,
so a log collector needs no parsing rules),
``configure_launcher_logging`` (the launcher's own user-facing messages; on a terminal through
``TerminalHandler``, which keeps the start's status line below them) and
``uvicorn_log_config`` (uvicorn's server and access logs and the frontend's loggers, for
``uvicorn.Config``), both at the ``--log-level`` asked for (``LOG_LEVELS``; the frontend's own
loggers show warnings and up unless it is debug, ``frontend_level``). Nothing is configured at
import: the commands call these at start-up.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import sys
import time
from typing import Any, TextIO

from openai_frontend.http.request_id import LOG_FIELD, RequestIdLogFilter

JSON_FORMAT = "json"
LAUNCHER_TEXT_FORMAT = "triton-chat: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")  # vLLM's --uvicorn-log-level's, less trace
DEFAULT_LOG_LEVEL = "info"
ERASE_LINE = "\r\x1b[K"  # to the line's start, then clear it


def frontend_level(level: str) -> str:
    """The frontend's loggers' level for ``--log-level``: its info lines are per request, so they
    (and its debug lines) show only at debug."""
    return "DEBUG" if level == "debug" else max(level.upper(), "WARNING", key=logging.getLevelName)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages are escaped by JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, LOG_FIELD, None)  # set by ``RequestIdLogFilter``
        if request_id is not None:
            line[LOG_FIELD] = request_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class TerminalHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Log lines on a terminal with one status line kept below them (``start_stages``' progress):
    the status is erased before each line and drawn again after it, under the handler's lock, so
    the two never mix. The status is cut to the terminal's width: a wrapped line cannot be erased."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._status = ""

    def set_status(self, text: str) -> None:
        """Show ``text`` as the status line ('' removes it)."""
        text = text[: max(shutil.get_terminal_size().columns - 1, 1)]
        self.acquire()
        try:
            if text != self._status:
                self._erase()
                self._status = text
                self._draw()
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        # Called with the lock held (``Handler.handle``).
        self._erase()
        super().emit(record)
        self._draw()

    def _erase(self) -> None:
        if self._status:
            self.stream.write(ERASE_LINE)

    def _draw(self) -> None:
        if self._status:
            self.stream.write(self._status)
            self.stream.flush()


def terminal_handler(logger: logging.Logger) -> TerminalHandler | None:
    """The ``TerminalHandler`` ``logger``'s lines reach (its own or an ancestor's), if any."""
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if isinstance(handler, TerminalHandler):
                return handler
        current = current.parent if current.propagate else None
    return None


def configure_launcher_logging(logger: logging.Logger, log_format: str, level: str = DEFAULT_LOG_LEVEL) -> None:
    """The launcher's messages go to stderr, in ``log_format``, from ``level`` up; once per logger.
    Text on a terminal goes through a ``TerminalHandler``, which can keep a status line."""
    if logger.handlers:
        return
    if log_format == JSON_FORMAT:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    else:
        handler = TerminalHandler(sys.stderr) if sys.stderr.isatty() else logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LAUNCHER_TEXT_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    # The launcher's messages are for the user; uvicorn has its own handlers.
    logger.propagate = False


def uvicorn_log_config(log_format: str, level: str = DEFAULT_LOG_LEVEL) -> dict[str, Any] | None:
    """``uvicorn.Config(log_config=...)`` for ``log_format`` and ``level``; None: uvicorn's own
    (text, info). JSON formats uvicorn's loggers and the frontend's (``openai_frontend``) alike, on
    stderr; the frontend's at ``frontend_level`` (WARNING at info, what text mode shows of them
    then too: Python's last-resort handler)."""
    if log_format != JSON_FORMAT:
        if level == DEFAULT_LOG_LEVEL:
            return None
        import uvicorn.config

        text = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
        text["loggers"]["uvicorn"]["level"] = level.upper()
        text["loggers"]["uvicorn.access"]["level"] = level.upper()
        text["loggers"]["openai_frontend"] = {
            "handlers": ["default"],
            "level": frontend_level(level),
            "propagate": False,
        }
        return dict(text)
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "json",
        "filters": ["request_id"],
        "stream": "ext://sys.stderr",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "filters": {"request_id": {"()": f"{RequestIdLogFilter.__module__}.{RequestIdLogFilter.__qualname__}"}},
        "handlers": {"json": handler},
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["json"], "level": level.upper(), "propagate": False},
            "openai_frontend": {"handlers": ["json"], "level": frontend_level(level), "propagate": False},
        },
    }
