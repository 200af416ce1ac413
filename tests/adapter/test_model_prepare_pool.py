"""Prompts are prepared (chat template, tokenizing, media) on a few threads beside the stub's: a
prompt that takes long holds up only itself, and past ``prepare_timeout_s`` it gets a clear error
while what its thread still computes is dropped; waiting places, early cancels and ``finalize``
behave as for any request."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from python_backend.engine import admission
from python_backend.intake.intake import Intake
from python_backend.intake.preparer import PreparerStats, usable_cpus
from python_backend.protocol import contract
from python_backend.protocol.errors import ErrorInfo
from python_backend.protocol.tokenize import TokenizeQuery
from tests.adapter.model_driver import (
    Served,
    chat_request,
    control_request,
    delta_of,
    ended_once,
    error_of,
    errors_of,
    text_of,
)
from tests.fakes.pb_utils import InferenceRequest, Sent

SLOW_MARK = "slow-to-prepare"
SHORT = {"max_tokens": 4}
WAIT_S = 30.0


@dataclass
class SlowPrompts:
    """Prompts naming ``SLOW_MARK`` are prepared only once ``release`` is set."""

    release: threading.Event
    started: threading.Event  # a preparer thread began on one

    def send(self, served: Served, stream: bool = False) -> InferenceRequest:
        """Send a slow prompt (request id ``slow``); return once a preparer thread holds it."""
        slow = slow_request("slow", stream=stream)
        served.execute(slow)
        assert self.started.wait(WAIT_S)  # it holds a preparer thread from here on
        return slow


@pytest.fixture
def slow_prompts(adapter: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowPrompts]:
    slow = SlowPrompts(threading.Event(), threading.Event())
    real = Intake.prepare

    def prepare(self: Any, get: Any, request_parameters: str = "") -> Any:
        if SLOW_MARK in (contract.read_string(get(contract.MESSAGES)) or ""):
            slow.started.set()
            slow.release.wait(60)
        return real(self, get, request_parameters)

    monkeypatch.setattr(Intake, "prepare", prepare)
    yield slow
    slow.release.set()  # never leave a preparer thread waiting


@pytest.fixture
def slow_queries(adapter: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowPrompts]:
    """Tokenize queries are answered only once ``release`` is set (a multi-megabyte text)."""
    slow = SlowPrompts(threading.Event(), threading.Event())
    real = adapter.answer_query

    def answer_query(*args: Any, **kwargs: Any) -> str:
        slow.started.set()
        slow.release.wait(60)
        return str(real(*args, **kwargs))

    monkeypatch.setattr(adapter, "answer_query", answer_query)
    yield slow
    slow.release.set()  # never leave a preparer thread waiting


def slow_request(request_id: str, stream: bool = False) -> InferenceRequest:
    messages = [{"role": "user", "content": f"{SLOW_MARK}: a prompt of many megabytes"}]
    return chat_request(request_id, stream=stream, parameters=SHORT, messages=messages)


def has_token(sent: list[Sent]) -> bool:
    return any((delta := delta_of(s)) is not None and bool(delta.text) for s in sent)


def time_out_on_the_one_preparer(
    serve: Callable[..., Served], slow: InferenceRequest, release: threading.Event
) -> ErrorInfo | None:
    """Send ``slow`` (held until ``release``) to a model with one preparer thread and a 2 s
    deadline: it is answered at the deadline; once released, its late result is dropped, and a short
    chat sent after it (prepared on that thread only once the late result came back) is served.
    The error ``slow`` ended with."""
    served = serve(prepare_timeout_s="2", prepare_workers="1")
    started = time.monotonic()
    served.answer(slow, timeout=WAIT_S)
    waited = time.monotonic() - started
    release.set()
    after = chat_request("after", parameters=SHORT)
    served.answer(after)
    stats = served.model._preparer.stats()
    served.finalize()
    assert 2.0 <= waited < 6.0
    assert error_of(ended_once(after.get_response_sender())) is None
    assert stats == PreparerStats(prepare_timeouts=1, late_preparations=1)
    return error_of(ended_once(slow.get_response_sender()))


def queue_behind_a_slow_prompt(
    served: Served, slow_prompts: SlowPrompts, queued: InferenceRequest
) -> tuple[ErrorInfo | None, ErrorInfo | None]:
    """Send ``queued`` while a slow prompt holds the model's one preparer thread: the errors the
    queued request and the slow one ended with; the model is finalized."""
    slow = slow_prompts.send(served)
    served.answer(queued, timeout=WAIT_S)
    slow.get_response_sender().wait_final(timeout=WAIT_S)
    served.finalize()
    return error_of(ended_once(queued.get_response_sender())), error_of(ended_once(slow.get_response_sender()))


@pytest.mark.skipif(usable_cpus() < 2, reason="one CPU: the model starts one preparer thread")
def test_a_slow_prompt_does_not_hold_up_the_short_ones_behind_it(
    serve: Callable[..., Served], slow_prompts: SlowPrompts
) -> None:
    served = serve(prepare_workers="2")
    slow = slow_prompts.send(served, stream=True)
    short = [chat_request(f"short-{i}", stream=True, parameters=SHORT) for i in range(3)]
    served.execute(*short)
    for request in short:
        request.get_response_sender().wait_for(has_token)  # its first token
    assert slow.get_response_sender().sent == []  # still being prepared meanwhile
    slow_prompts.release.set()
    slow.get_response_sender().wait_final()
    served.finalize()
    for request in [*short, slow]:
        assert error_of(ended_once(request.get_response_sender())) is None
        assert text_of(request.get_response_sender())


def test_a_prompt_not_prepared_in_time_is_a_400_and_its_late_result_is_dropped(
    serve: Callable[..., Served], slow_prompts: SlowPrompts
) -> None:
    error = time_out_on_the_one_preparer(serve, slow_request("slow"), slow_prompts.release)
    assert error is not None and (error.status, error.code, error.param) == (400, "prepare_timeout", "messages")
    assert "prepare_timeout_s" in error.message


def test_a_request_that_never_got_a_free_preparer_is_a_429_saying_so(
    serve: Callable[..., Served], slow_prompts: SlowPrompts
) -> None:
    served = serve(prepare_timeout_s="2", prepare_workers="1")
    error, slow_error = queue_behind_a_slow_prompt(served, slow_prompts, chat_request("queued", parameters=SHORT))
    assert error is not None and (error.status, error.code) == (429, "preparers_busy")
    assert "prepare_workers" in error.message
    assert slow_error is not None and slow_error.code == "prepare_timeout"


def test_requests_being_prepared_count_against_the_waiting_limit(
    serve: Callable[..., Served], slow_prompts: SlowPrompts
) -> None:
    served = serve(max_waiting_requests="1")
    slow = slow_prompts.send(served)
    second = chat_request("second", parameters=SHORT)
    served.answer(second)
    slow_prompts.release.set()
    slow.get_response_sender().wait_final()
    third = chat_request("third", parameters=SHORT)  # the place is free again
    served.answer(third)
    served.finalize()
    error = error_of(ended_once(second.get_response_sender()))
    assert error is not None and (error.status, error.code) == (429, "overloaded")
    assert errors_of(slow, third) == [None, None]


def test_a_cancel_while_the_prompt_is_prepared_still_cancels_it_however_long_that_takes(
    serve: Callable[..., Served], slow_prompts: SlowPrompts, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine remembers an early cancel this long; the preparation here outlasts it.
    monkeypatch.setattr(admission, "EARLY_CANCEL_S", 0.2)
    served = serve()
    slow = slow_prompts.send(served, stream=True)
    cancel = control_request(contract.CANCEL_REQUEST, "slow", "cancel")
    served.answer(cancel)
    threading.Event().wait(0.5)  # the engine's own record of the cancel expires (time is the point)
    slow_prompts.release.set()
    slow.get_response_sender().wait_final()
    served.finalize()
    assert error_of(ended_once(slow.get_response_sender())) is None
    assert text_of(slow.get_response_sender()) == ""  # ended before its first token


def test_finalize_waits_for_a_request_being_prepared_only_until_its_deadline(
    serve: Callable[..., Served], slow_prompts: SlowPrompts
) -> None:
    served = serve(prepare_timeout_s="2")
    slow = slow_prompts.send(served)
    started = time.monotonic()
    served.finalize()
    took = time.monotonic() - started
    error = error_of(ended_once(slow.get_response_sender()))
    assert error is not None and error.code == "prepare_timeout"
    assert took < 10.0


def test_a_slow_tokenize_query_does_not_hold_up_the_stubs_thread(
    serve: Callable[..., Served], slow_queries: SlowPrompts
) -> None:
    served = serve()
    query = control_request(contract.TOKENIZE, TokenizeQuery(prompt="Hello there").to_wire(), "tokenize")
    probe = control_request(contract.HEALTH_PROBE, True, "probe")
    plain = chat_request("plain", parameters=SHORT)
    try:
        served.execute(query, probe, plain)  # returns at once: the query waits on a preparer thread
        probe.get_response_sender().wait_final()
        plain.get_response_sender().wait_final()
        assert query.get_response_sender().sent == []
    finally:
        slow_queries.release.set()
    query.get_response_sender().wait_final()
    served.finalize()
    assert errors_of(query, probe, plain) == [None, None, None]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        (TokenizeQuery(prompt="Hello"), "prompt"),
        (TokenizeQuery(messages=[{"role": "user", "content": "Hi"}]), "messages"),
    ],
)
def test_a_tokenize_query_not_answered_in_time_is_a_400_and_its_late_answer_is_dropped(
    serve: Callable[..., Served], slow_queries: SlowPrompts, query: TokenizeQuery, param: str
) -> None:
    slow = control_request(contract.TOKENIZE, query.to_wire(), "tokenize")
    error = time_out_on_the_one_preparer(serve, slow, slow_queries.release)
    assert error is not None and (error.status, error.code, error.param) == (400, "prepare_timeout", param)


def test_a_tokenize_query_that_never_got_a_free_preparer_is_a_429(
    serve: Callable[..., Served], slow_prompts: SlowPrompts
) -> None:
    served = serve(prepare_timeout_s="2", prepare_workers="1")
    queued = control_request(contract.TOKENIZE, TokenizeQuery(prompt="Hello").to_wire(), "tokenize")
    error, _ = queue_behind_a_slow_prompt(served, slow_prompts, queued)
    assert error is not None and (error.status, error.code) == (429, "preparers_busy")
