"""The cancel watcher asks each request it is given and reports the cancelled ones."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from python_backend.engine.cancel_watch import CancelWatcher, Watched

DEADLINE_S = 5.0


class _Reports:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.changed = threading.Event()

    def __call__(self, request_id: str) -> None:
        self.ids.append(request_id)
        self.changed.set()

    def wait_for(self, count: int) -> list[str]:
        deadline = time.monotonic() + DEADLINE_S
        while len(self.ids) < count and time.monotonic() < deadline:
            self.changed.wait(0.05)
            self.changed.clear()
        return self.ids


def test_only_cancelled_requests_are_reported() -> None:
    reports = _Reports()
    watcher = CancelWatcher(reports)
    watcher.start()
    try:
        watcher.check([Watched("a", lambda: False), Watched("b", lambda: True), Watched("c", lambda: False)])
        assert reports.wait_for(1) == ["b"]
    finally:
        watcher.stop()


def test_a_failing_transport_counts_as_cancelled(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> bool:
        raise RuntimeError("stub gone")

    reports = _Reports()
    watcher = CancelWatcher(reports)
    watcher.start()
    try:
        with caplog.at_level(logging.ERROR):
            watcher.check([Watched("x", broken)])
            assert reports.wait_for(1) == ["x"]
        assert "is_cancelled() failed for x" in caplog.text
    finally:
        watcher.stop()


def test_a_newer_set_replaces_one_not_yet_started() -> None:
    """While one round is blocked, later sets replace each other: only the latest is asked."""
    release = threading.Event()
    asked: list[str] = []

    def slow() -> bool:
        asked.append("slow")
        release.wait(DEADLINE_S)
        return False

    def seen(name: str) -> Watched:
        def ask() -> bool:
            asked.append(name)
            return True

        return Watched(name, ask)

    reports = _Reports()
    watcher = CancelWatcher(reports)
    watcher.start()
    try:
        watcher.check([Watched("slow", slow)])
        deadline = time.monotonic() + DEADLINE_S
        while not asked and time.monotonic() < deadline:
            time.sleep(0.01)
        watcher.check([seen("old")])
        watcher.check([seen("new")])
        release.set()
        assert reports.wait_for(1) == ["new"]
        assert "old" not in asked
    finally:
        watcher.stop()


def _watch_threads() -> int:
    return sum(t.name == "triton-chat-cancel-watch" and t.is_alive() for t in threading.enumerate())


def test_stop_ends_the_thread() -> None:
    before = _watch_threads()
    watcher = CancelWatcher(lambda request_id: None)
    watcher.start()
    assert _watch_threads() == before + 1
    watcher.stop()
    assert _watch_threads() == before
