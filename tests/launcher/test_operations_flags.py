"""The operations flags (CORS, SSE keep-alive, log format) and the JSON log lines they select."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import sys

import pytest

from openai_frontend.launcher.cli import parse_args, parse_serve_args
from openai_frontend.launcher.frontend_only import frontend_settings
from openai_frontend.launcher.log_format import JsonFormatter, configure_launcher_logging, uvicorn_log_config
from openai_frontend.launcher.options import FrontendOptions
from openai_frontend.settings import DEFAULT_CORS_HEADERS, DEFAULT_CORS_METHODS

FRONTEND = ["frontend", "--triton-url", "127.0.0.1:8001", "--served-model-name", "m"]


def test_operations_are_off_by_default() -> None:
    options = parse_args(FRONTEND)
    assert isinstance(options, FrontendOptions)
    settings = frontend_settings(options)
    assert settings.allowed_origins == [] and not settings.allow_credentials
    assert settings.cors_methods == DEFAULT_CORS_METHODS and settings.cors_headers == DEFAULT_CORS_HEADERS
    assert settings.sse_keepalive_s == 0 and settings.log_format == "text"


def test_operations_flags_reach_the_frontend_settings() -> None:
    options = parse_args(
        [*FRONTEND, "--allowed-origins", "https://a.test", "--allowed-origins", "https://b.test",
         "--allowed-methods", "POST", "--allowed-headers", "Authorization", "--allow-credentials",
         "--sse-keepalive", "15", "--log-format", "json"]
    )  # fmt: skip
    assert isinstance(options, FrontendOptions)
    settings = frontend_settings(options)
    assert settings.allowed_origins == ["https://a.test", "https://b.test"]
    assert (settings.cors_methods, settings.cors_headers) == (("POST",), ("Authorization",))
    assert settings.allow_credentials and settings.sse_keepalive_s == 15.0 and settings.log_format == "json"


def test_serve_takes_the_same_flags() -> None:
    options = parse_serve_args(["serve", "--allowed-origins", "*", "--log-format", "json", "--sse-keepalive", "5"])
    assert options.operations.allowed_origins == ("*",)
    assert (options.operations.log_format, options.operations.sse_keepalive_s) == ("json", 5.0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--allowed-origins", "*", "--allow-credentials"], "named --allowed-origins"),
        (["--sse-keepalive", "-1"], "--sse-keepalive must be >= 0"),
        (["--allowed-origins", " "], "--allowed-origins must not be empty"),
        (["--log-format", "xml"], "invalid choice"),
    ],
)
def test_bad_operations_flags_are_usage_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args([*FRONTEND, *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("openai_frontend.chat", logging.WARNING, __file__, 1, message, args, exc_info)


def test_a_json_log_line_is_one_object_with_the_message() -> None:
    line = JsonFormatter().format(_record("stream %s ended\nearly", "abc"))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "stream abc ended\nearly"
    assert (entry["level"], entry["logger"]) == ("WARNING", "openai_frontend.chat")
    assert entry["time"].endswith("Z") and "exception" not in entry
    failed = json.loads(JsonFormatter().format(_record("failed", exc=True)))
    assert "ValueError: boom" in failed["exception"]


def test_the_launcher_logs_json_lines_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("test.launcher.json")
    configure_launcher_logging(logger, "json")
    try:
        logger.info("serving '%s'", "m")
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
    assert json.loads(capsys.readouterr().err)["message"] == "serving 'm'"


def test_the_uvicorn_config_formats_uvicorn_and_frontend_logs_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    assert uvicorn_log_config("text") is None  # uvicorn's own text format
    config = uvicorn_log_config("json")
    assert config is not None
    stream = io.StringIO()
    config["handlers"]["json"]["stream"] = stream
    names = ("uvicorn", "uvicorn.error", "uvicorn.access", "openai_frontend")
    loggers = [logging.getLogger(name) for name in names]
    saved = [(one, one.handlers[:], one.level, one.propagate) for one in loggers]
    try:
        logging.config.dictConfig(config)
        logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/health", "1.1", 200)
        logging.getLogger("openai_frontend.chat.serving").warning("a frontend warning")
    finally:
        for one, handlers, level, propagate in saved:
            one.handlers, one.propagate = handlers, propagate
            one.setLevel(level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["logger"], e["message"]) for e in lines] == [
        ("uvicorn.access", '127.0.0.1:5 - "GET /health HTTP/1.1" 200'),
        ("openai_frontend.chat.serving", "a frontend warning"),
    ]
