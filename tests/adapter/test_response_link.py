"""A request's response link: no cancellation question reaches Triton after the final response.

Triton frees a request's response factory when its final response is sent, and asking
``is_cancelled()`` after that crashed tritonserver (a use-after-free the cancellation watcher hit
when a request finished during its check). The Python-backend module exists only inside Triton's
stub, so the fake module (``tests/fakes/pb_utils.py``) stands in for it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

from tests.fakes import pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class FakeSender:
    """Records calls; a final send takes a while, as the IPC round trip does."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.final_sent = threading.Event()

    def is_cancelled(self) -> bool:
        if self.final_sent.is_set():
            raise AssertionError("is_cancelled() after the final response: Triton would read freed memory")
        self.calls.append("is_cancelled")
        return False

    def send(self, response: Any = None, flags: int = 0) -> None:
        self.calls.append(f"send:{flags}")
        if flags & FINAL:
            time.sleep(0.05)
            self.final_sent.set()


@pytest.fixture
def link_class(monkeypatch: pytest.MonkeyPatch) -> type:
    pb_utils.install(monkeypatch)
    return sys.modules["python_backend.triton.sender"].ResponseLink


def test_nothing_is_asked_after_the_final_response(link_class: type) -> None:
    sender = FakeSender()
    link = link_class(sender)
    assert link.is_cancelled() is False
    link.send("token", flags=0)
    link.send(flags=FINAL)
    assert link.is_cancelled() is False  # answered here, not by Triton
    assert sender.calls == ["is_cancelled", "send:0", f"send:{FINAL}"]


def test_a_question_during_the_final_send_waits_for_it_and_is_not_forwarded(link_class: type) -> None:
    sender = FakeSender()
    link = link_class(sender)
    answers: list[bool] = []
    final = threading.Thread(target=link.send, kwargs={"flags": FINAL})
    final.start()
    time.sleep(0.01)  # the final send is in its round trip
    asker = threading.Thread(target=lambda: answers.append(link.is_cancelled()))
    asker.start()
    final.join(5)
    asker.join(5)
    assert answers == [False]
    assert "is_cancelled" not in sender.calls


def test_a_second_final_response_is_refused(link_class: type) -> None:
    link = link_class(FakeSender())
    link.send(flags=FINAL)
    with pytest.raises(RuntimeError, match="already sent"):
        link.send(flags=FINAL)
