"""The start a person can watch: stage lines with the seconds since start, a status line with a
progress bar on a terminal only, events from the model's side read back, and a failed start's log."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from openai_frontend.launcher import demo_model, start_stages
from openai_frontend.launcher.log_format import ERASE_LINE, TerminalHandler, configure_launcher_logging
from openai_frontend.launcher.start_stages import EventFile, StageReport, following, progress_bar, stage_prefix
from openai_frontend.launcher.triton_log import TAIL_LINE_CHARS, last_lines
from openai_frontend.launcher.tritonserver import TritonStartError
from python_backend.protocol.start_events import (
    BEGIN,
    CONVERSION,
    END,
    FAILED,
    KERNEL,
    PROGRESS,
    START_EVENTS_ENV,
    WEIGHTS,
    StageReporter,
    StartEvent,
    StartEventError,
    write_event,
)

STARTED = 1_000_000.0


class _Clock:
    def __init__(self) -> None:
        self.now = STARTED

    def __call__(self) -> float:
        return self.now


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _logger(stream: io.StringIO, handler: logging.Handler | None = None) -> logging.Logger:
    logger = logging.getLogger(f"tests.start_stages.{id(stream)}")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = handler or logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("triton-chat: %(message)s"))
    logger.addHandler(handler)
    return logger


def _event(stage: str, phase: str, at: float, **fields: object) -> StartEvent:
    return StartEvent(stage, phase, STARTED + at, pid=7, **fields)  # type: ignore[arg-type]


def test_an_event_survives_its_line_and_a_bad_line_says_what_is_wrong() -> None:
    event = StartEvent(WEIGHTS, END, 12.5, "m, bfloat16, 0.27 GB", None, 0.9, 42)
    line = event.to_line()
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert StartEvent.from_line(line) == event
    for bad, words in [
        ("weights loaded", "not JSON"),
        ("[1]", "not an object"),
        ('{"stage": "weights", "phase": "halfway", "at": 1}', "phase"),
        ('{"stage": "weights", "phase": "progress", "at": 1, "fraction": 2}', "fraction"),
    ]:
        with pytest.raises(StartEventError, match=words):
            StartEvent.from_line(bad)


def test_events_are_written_only_where_the_launcher_asks(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_event(StartEvent(KERNEL, BEGIN, 1.0, "rope"), environ={})
    assert not path.exists()
    reporter = StageReporter(WEIGHTS, environ={START_EVENTS_ENV: str(path)})
    reporter.begin("m, float32")
    for step in range(1, 101):
        reporter.progress(step / 100)  # a hundred at once: one written, and the last
    reporter.end("m, float32, 0.01 GB")
    events = [StartEvent.from_line(line) for line in path.read_text().splitlines()]
    assert [(e.phase, e.fraction) for e in events] == [(BEGIN, None), (PROGRESS, 0.01), (PROGRESS, 1.0), (END, None)]
    assert events[-1].seconds is not None and events[-1].seconds >= 0


def test_the_event_file_gives_each_whole_line_once_and_skips_bad_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events.jsonl"
    events = EventFile(path, logging.getLogger("tests.start_stages"))
    assert events.read_new() == []  # not written yet
    first = StartEvent(KERNEL, BEGIN, 1.0, "rope").to_line()
    path.write_text(first + "not an event\n" + first[:10])
    assert [e.detail for e in events.read_new()] == ["rope"]
    assert "ignoring a line" in caplog.text and "not JSON" in caplog.text
    with open(path, "a") as handle:
        handle.write(first[10:])
    assert [e.detail for e in events.read_new()] == ["rope"]
    assert events.read_new() == []


def test_stage_lines_carry_the_seconds_since_start() -> None:
    out = io.StringIO()
    clock = _Clock()
    report = StageReport(_logger(out), started=STARTED, clock=clock)
    clock.now = STARTED + 0.4
    report.line("started tritonserver (pid 1); log: /tmp/t.log")
    report.take(
        [
            _event(WEIGHTS, BEGIN, 8.25, detail="SmolLM2-135M-Instruct, bfloat16"),
            _event(WEIGHTS, PROGRESS, 8.5, fraction=0.5),
            _event(WEIGHTS, END, 12.3, detail="SmolLM2-135M-Instruct, bfloat16, 0.27 GB", seconds=4.05),
            _event(KERNEL, BEGIN, 12.4, detail="rms_norm"),
            _event(KERNEL, END, 14.6, detail="rms_norm", seconds=2.2),
            _event(KERNEL, FAILED, 15.0, detail="rope: the compiler failed", seconds=0.1),
            _event(WEIGHTS, FAILED, 16.0, detail="m: out of memory", seconds=1.0),
        ]
    )
    assert out.getvalue().splitlines() == [
        "triton-chat: [    0.4s] started tritonserver (pid 1); log: /tmp/t.log",
        "triton-chat: [    8.2s] loading weights (SmolLM2-135M-Instruct, bfloat16)",
        "triton-chat: [   12.3s] weights loaded (SmolLM2-135M-Instruct, bfloat16, 0.27 GB, 4.0 s)",
        "triton-chat: [   14.6s] built CPU kernel rms_norm (2.2 s)",
        "triton-chat: [   15.0s] CPU kernel not built (rope: the compiler failed); the model runs without it",
        "triton-chat: [   16.0s] loading weights failed (m: out of memory)",
    ]
    assert stage_prefix(12345.67) == "[12345.7s]"
    assert progress_bar(0.5, width=10) == "[#####-----]  50%"


def test_off_a_terminal_progress_is_a_plain_line_every_ten_seconds() -> None:
    out = io.StringIO()
    clock = _Clock()
    report = StageReport(_logger(out), started=STARTED, clock=clock)
    report.waiting("converting the demo model")
    report.take([_event(CONVERSION, PROGRESS, 1.0, fraction=0.15, detail="reading the GGUF")])
    for second in (2, 5, 11, 15, 21, 31):
        clock.now = STARTED + second
        if second == 21:
            report.take([_event(CONVERSION, PROGRESS, 20.0, fraction=0.75, detail="copying")])
        report.tick()
    report.done()
    text = out.getvalue()
    assert text.splitlines() == [
        "triton-chat: [   11.0s] converting the demo model: 15% (reading the GGUF)",
        "triton-chat: [   21.0s] converting the demo model: 75% (copying)",
    ]
    assert "\r" not in text and "\x1b" not in text


def test_on_a_terminal_the_status_line_has_a_bar_and_never_mixes_with_lines() -> None:
    tty = _Tty()
    handler = TerminalHandler(tty)
    clock = _Clock()
    report = StageReport(_logger(tty, handler), started=STARTED, clock=clock, terminal=handler)
    report.waiting("starting tritonserver and the model")
    assert tty.getvalue() == "[    0.0s] starting tritonserver and the model ..."
    clock.now = STARTED + 9.0
    report.take([_event(WEIGHTS, BEGIN, 8.0, detail="m, float32"), _event(WEIGHTS, PROGRESS, 8.5, fraction=0.25)])
    screen = tty.getvalue().split(ERASE_LINE)
    # The line was written on an erased status line, then the status drawn again below it.
    assert any(part.startswith("triton-chat: [    8.0s] loading weights (m, float32)\n") for part in screen)
    assert screen[-1] == f"[    9.0s] loading weights {progress_bar(0.25)}"
    report.done()
    assert tty.getvalue().endswith(ERASE_LINE)  # nothing left on the status line


def test_the_launcher_logs_through_a_terminal_handler_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    for tty, log_format, expected in [(True, "text", True), (False, "text", False), (True, "json", False)]:
        stream = _Tty() if tty else io.StringIO()
        monkeypatch.setattr("sys.stderr", stream)
        logger = logging.getLogger(f"tests.start_stages.configure.{tty}.{log_format}")
        logger.handlers.clear()
        configure_launcher_logging(logger, log_format)
        child = logging.getLogger(logger.name + ".serve")
        assert (StageReport.for_logger(child).terminal is not None) is expected
        logger.handlers.clear()
    quiet = logging.getLogger("tests.start_stages.quiet")
    quiet.handlers.clear()
    monkeypatch.setattr("sys.stderr", _Tty())
    configure_launcher_logging(quiet, "text", "warning")
    assert StageReport.for_logger(quiet).terminal is None  # no stage lines, so no status either
    quiet.handlers.clear()


def test_following_shows_what_was_written_before_the_block_ends(tmp_path: Path) -> None:
    out = io.StringIO()
    report = StageReport(_logger(out))
    events = EventFile(tmp_path / "events.jsonl", logging.getLogger("tests.start_stages"))
    environ = {START_EVENTS_ENV: str(events.path)}
    with following(report, events, "loading the model"):
        reporter = StageReporter(KERNEL, environ=environ)
        reporter.begin("rope")
        reporter.end("rope")
    assert out.getvalue().count("built CPU kernel rope (") == 1


def test_a_failed_start_names_the_log_and_shows_its_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    log.write_text(
        'I1201 model_lifecycle.cc:472] "loading: triton_chat:1"\n'
        "E1201 model_lifecycle.cc:642] \"failed to load 'triton_chat' version 1: Internal: ModelLoadError: "
        'the tokenizer has no chat_template\\n\\nAt:\\n  /x/loader.py(142): load_model\\n"\n'
        "error: creating server: Internal - failed to load all models\n"
    )
    error = TritonStartError("tritonserver exited with status 1 while starting", log, log.read_text())
    assert error.what == (
        "tritonserver exited with status 1 while starting: the model 'triton_chat' failed to load: "
        "Internal: ModelLoadError: the tokenizer has no chat_template"
    )
    assert f"(full log: {log})" in str(error)  # what the supervisor and the tests' fixtures show
    out = io.StringIO()
    clock = _Clock()
    report = StageReport(_logger(out), started=STARTED, clock=clock)
    clock.now = STARTED + 25.25
    report.start_failed(error.what, error.log_path, error.tail)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"triton-chat: [   25.2s] start failed: {error.what}"
    assert lines[1] == f"triton-chat: tritonserver's log is {log}; its last lines:"
    assert lines[2:] == [f"  {line}" for line in log.read_text().splitlines()]


def test_the_demo_conversion_says_when_it_begins_and_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "demo.gguf"
    gguf.write_bytes(b"")
    children: list[Path | None] = []

    def convert(source: Path, out: Path, events: Path | None) -> None:
        children.append(events)
        out.mkdir()
        (out / demo_model.MARKER_NAME).write_text("{}")

    monkeypatch.setattr(demo_model, "find_demo_gguf", lambda: gguf)
    monkeypatch.setattr(demo_model, "check_conversion_packages", lambda: None)
    monkeypatch.setattr(demo_model, "_run_conversion", convert)
    said: list[str] = []
    events = tmp_path / "events.jsonl"
    demo_model.ensure_demo_model(tmp_path / "cache", said.append, events=events)
    assert children == [events]
    assert said[0].startswith("converting the demo model SmolLM2-135M-Instruct (GGUF -> safetensors, once")
    assert said[1].startswith("demo model converted (") and said[1].endswith(" s)")
    assert [step for step, _ in demo_model.CONVERSION_STEPS] == sorted(step for step, _ in demo_model.CONVERSION_STEPS)


def test_unknown_stages_from_a_newer_model_still_show(tmp_path: Path) -> None:
    out = io.StringIO()
    report = StageReport(_logger(out), started=STARTED)
    report.take([_event("warm{up}", BEGIN, 1.0), _event("warm{up}", END, 2.0, detail="3 passes", seconds=1.0)])
    assert out.getvalue().splitlines() == ["triton-chat: [    2.0s] warm{up} end (3 passes)"]
    assert start_stages.ACTIVE.keys() == {CONVERSION, WEIGHTS, KERNEL}


def test_the_last_lines_of_a_failed_start_skip_tables_noise_and_blank_lines(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    long_line = 'E1201 pb_stub.cc:366] "Failed to initialize Python stub: ' + "x" * 1000
    log.write_text(
        f"I1201 loading: triton_chat:1\n{long_line}\n+------+\n| Model | Status |\n\n"
        "Error: Failed to initialize NVML\nerror: creating server: Internal - failed to load all models\n"
    )
    assert last_lines(log, 5).splitlines() == [
        "I1201 loading: triton_chat:1",
        long_line[:TAIL_LINE_CHARS] + " ...",
        "error: creating server: Internal - failed to load all models",
    ]
    assert last_lines(log, 1) == "error: creating server: Internal - failed to load all models"
    assert last_lines(tmp_path / "none.log", 5) == "(no tritonserver log)"
