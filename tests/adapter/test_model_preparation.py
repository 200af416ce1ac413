"""Requests are prepared beside the stub's thread: a grammar that compiles slowly, or too large a
schema, holds up no one else, and its request gets a 400 naming ``response_format``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from python_backend.protocol import contract
from python_backend.sampling import structured
from tests.adapter.model_driver import Served, chat_request, control_request, ended_once, error_of, errors_of, text_of

SLOW_MARK = "slow-to-compile"
SHORT = {"max_tokens": 4}


def schema_format(name: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {name: {"type": "string"}}, "required": [name]}
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.fixture
def slow_compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Schemas naming ``SLOW_MARK`` compile only once the returned event is set; counts compiles."""
    release = threading.Event()
    real = structured.GrammarCompiler._compile

    def compile_(self: structured.GrammarCompiler, spec: structured.GrammarSpec) -> Any:
        if SLOW_MARK in spec.schema:
            release.wait(60)
        return real(self, spec)

    monkeypatch.setattr(structured.GrammarCompiler, "_compile", compile_)
    yield release
    release.set()  # never leave the compile thread waiting


def test_a_slow_grammar_does_not_hold_up_other_requests(
    serve: Callable[..., Served], slow_compiles: threading.Event
) -> None:
    served = serve()
    slow = chat_request("slow", parameters={**SHORT, "response_format": schema_format(SLOW_MARK)})
    plain = chat_request("plain", parameters=SHORT)
    probe = control_request(contract.HEALTH_PROBE, True, "probe")
    served.execute(slow, plain, probe)
    plain.get_response_sender().wait_final()
    probe.get_response_sender().wait_final()
    assert slow.get_response_sender().sent == []  # still compiling while the others were answered
    slow_compiles.set()
    slow.get_response_sender().wait_final()
    served.finalize()
    assert errors_of(plain, probe, slow) == [None, None, None]
    # Its answer follows its grammar: the object its schema asks for (cut short by max_tokens).
    text, opening = text_of(slow.get_response_sender()), json.dumps({SLOW_MARK: ""}, separators=(",", ":"))[:-2]
    assert text and (text.startswith(opening) or opening.startswith(text)), text


def test_a_grammar_not_ready_in_time_is_a_400_naming_response_format(
    serve: Callable[..., Served], slow_compiles: threading.Event
) -> None:
    served = serve(grammar_compile_timeout_s="1")
    slow = chat_request("slow", parameters={**SHORT, "response_format": schema_format(SLOW_MARK)})
    started = time.monotonic()
    served.answer(slow)
    waited = time.monotonic() - started
    # The same schema again, once it has compiled, is served from the cache.
    slow_compiles.set()
    again = chat_request("again", parameters={**SHORT, "response_format": schema_format(SLOW_MARK)})
    served.answer(again)
    served.finalize()
    error = error_of(ended_once(slow.get_response_sender()))
    assert error is not None and (error.status, error.param) == (400, "response_format")
    assert "grammar_compile_timeout_s" in error.message
    assert 1.0 <= waited < 5.0
    assert error_of(ended_once(again.get_response_sender())) is None


def test_a_schema_over_the_size_ceiling_is_refused_before_compiling(
    serve: Callable[..., Served], slow_compiles: threading.Event
) -> None:
    served = serve(max_response_format_bytes="1000")
    enum = [f"{SLOW_MARK}-{i}" for i in range(200)]  # a compile would wait on the event
    schema = {"type": "object", "properties": {"a": {"enum": enum}}, "required": ["a"]}
    big = {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
    request = chat_request("big", parameters={**SHORT, "response_format": big})
    served.answer(request, timeout=10)
    served.finalize()
    error = error_of(ended_once(request.get_response_sender()))
    assert error is not None and (error.status, error.param) == (400, "response_format")
    assert "max_response_format_bytes" in error.message


def test_requests_in_preparation_count_against_the_waiting_limit(
    serve: Callable[..., Served], slow_compiles: threading.Event
) -> None:
    served = serve(max_waiting_requests="1")
    slow = chat_request("slow", parameters={**SHORT, "response_format": schema_format(SLOW_MARK)})
    second = chat_request("second", parameters=SHORT)
    served.execute(slow, second)
    second.get_response_sender().wait_final()
    slow_compiles.set()
    slow.get_response_sender().wait_final()
    third = chat_request("third", parameters=SHORT)  # the place is free again
    served.answer(third)
    served.finalize()
    error = error_of(ended_once(second.get_response_sender()))
    assert error is not None and error.status == 429
    assert errors_of(slow, third) == [None, None]


def test_finalize_refuses_requests_still_waiting_for_their_grammar(
    serve: Callable[..., Served], slow_compiles: threading.Event
) -> None:
    served = serve()
    slow = chat_request("slow", parameters={**SHORT, "response_format": schema_format(SLOW_MARK)})
    served.execute(slow)
    served.finalize()
    error = error_of(ended_once(slow.get_response_sender()))
    assert error is not None and (error.status, error.code) == (503, "shutting_down")
