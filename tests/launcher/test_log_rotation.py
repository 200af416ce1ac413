"""tritonserver's log kept under its size: copied aside and cut while the server keeps writing."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import BinaryIO, cast

import pytest

from openai_frontend.launcher.cli import parse_serve_args
from openai_frontend.launcher.log_rotation import BACKUPS, DEFAULT_MAX_MB, LogRotation, backup_path
from openai_frontend.launcher.supervisor import Supervisor
from openai_frontend.launcher.tritonserver import TritonServerProcess

WAIT_S = 10.0


def _fill(writer: BinaryIO, text: bytes, size: int) -> None:
    while writer.tell() < size:
        writer.write(text)
    writer.flush()


def test_a_log_past_its_limit_is_kept_aside_and_the_writer_goes_on_at_its_start(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    # Opened for appending, as tritonserver's log is: the writer's next line lands at offset 0.
    with open(log, "ab") as writer:
        _fill(writer, b"E1204 model.py] internal error while rendering the template\n", 4096)
        old = log.read_bytes()
        assert LogRotation(log, 1024).check()
        writer.write(b"I1204 next line\n")
        writer.flush()
    assert log.read_bytes() == b"I1204 next line\n"  # no hole of NULs before it
    assert backup_path(log, 1).read_bytes() == old
    assert backup_path(log, 1).stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tritonserver.log", "tritonserver.log.1"]  # no partial copy


def test_only_the_newest_copies_are_kept(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    rotation = LogRotation(log, 10)
    for turn in range(BACKUPS + 2):
        log.write_text(f"turn {turn} " * 10)
        assert rotation.check()
    kept = sorted(path.name for path in tmp_path.iterdir())
    assert kept == ["tritonserver.log"] + [f"tritonserver.log.{index}" for index in range(1, BACKUPS + 1)]
    assert backup_path(log, 1).read_text().startswith(f"turn {BACKUPS + 1} ")
    assert backup_path(log, 2).read_text().startswith(f"turn {BACKUPS} ")


def test_a_log_within_its_limit_a_missing_one_and_a_limit_of_zero_rotate_nothing(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    assert not LogRotation(log, 10).check()
    log.write_text("x" * 10)
    assert not LogRotation(log, 10).check()
    log.write_text("x" * 1000)
    assert not LogRotation(log, 0).check()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tritonserver.log"]


def test_the_limit_is_a_serve_flag_in_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_CHAT_API_KEY", raising=False)
    assert parse_serve_args(["serve"]).triton_log_max_mb == DEFAULT_MAX_MB
    assert parse_serve_args(["serve", "--triton-log-max-mb", "0"]).triton_log_max_mb == 0
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(["serve", "--triton-log-max-mb", "-1"])
    assert exit_info.value.code == 2


class _HealthyTriton:
    pid = 1

    def model_processes(self) -> list[int]:
        return [100]

    def still_running(self, pids: set[int]) -> set[int]:
        return pids

    def exit_code(self) -> int | None:
        return None

    def probe_model(self, model: str) -> str | None:
        return None


class _BrokenRotation(LogRotation):
    def check(self) -> bool:
        raise OSError(28, "No space left on device")


def _watch(rotation: LogRotation) -> tuple[Supervisor, threading.Thread]:
    watcher = Supervisor(
        cast(TritonServerProcess, _HealthyTriton()), Path("/repo"), {}, "m", 5.0, lambda: None, log_rotation=rotation
    )
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    return watcher, thread


def test_the_supervisor_rotates_the_log_while_it_watches(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    watcher, thread = _watch(LogRotation(log, 100))
    try:
        log.write_text("E1204 traceback line\n" * 50)
        deadline = time.monotonic() + WAIT_S
        # The copy appears whole (renamed into place); the log is cut just after it.
        while not (backup_path(log, 1).exists() and log.stat().st_size == 0) and time.monotonic() < deadline:
            watcher.stop.wait(0.05)
        assert backup_path(log, 1).read_text().count("traceback") == 50
        assert log.read_text() == ""
    finally:
        watcher.stop.set()
        thread.join(5)


def test_a_rotation_that_fails_is_said_once_and_watching_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="openai_frontend.launcher")
    watcher, thread = _watch(_BrokenRotation(tmp_path / "tritonserver.log", 100))
    try:
        deadline = time.monotonic() + WAIT_S
        while watcher.log_rotation is not None and time.monotonic() < deadline:
            watcher.stop.wait(0.05)
        assert watcher.log_rotation is None
        assert thread.is_alive()
    finally:
        watcher.stop.set()
        thread.join(5)
    warnings = [record.getMessage() for record in caplog.records if "rotate" in record.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0]
