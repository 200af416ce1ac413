"""What the model answers for what the engine says, with a stand-in engine: one final each."""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest

from python_backend.engine.liveness import EngineHealth
from python_backend.engine.sequence import EngineEvent
from python_backend.protocol import contract
from tests.adapter.model_driver import Served, chat_request, control_request, ended_once, error_of
from tests.fakes.engine import FakeEngine


@pytest.fixture
def fake_engine(adapter: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    engine = FakeEngine()
    monkeypatch.setattr(adapter, "Engine", engine.build)
    return engine


def test_a_stalled_engine_fails_the_probe_with_503(serve: Callable[..., Served], fake_engine: FakeEngine) -> None:
    fake_engine.health_report = EngineHealth(running=True, busy=True, since_last_pass_s=3600.0)
    served = serve()
    probe = control_request(contract.HEALTH_PROBE, True, "probe")
    served.execute(probe)
    served.finalize()
    error = error_of(ended_once(probe.get_response_sender()))
    assert error is not None and (error.status, error.code) == (503, "engine_stalled")


def test_an_unexpected_error_reading_a_request_is_one_500(
    serve: Callable[..., Served], fake_engine: FakeEngine
) -> None:
    fake_engine.submit_error = RuntimeError("a bug")
    served = serve()
    request = chat_request("unlucky", parameters={"max_tokens": 4})
    after = control_request(contract.CANCEL_REQUEST, "unlucky", "after")  # the batch goes on
    served.execute(request, after)
    served.finalize()
    error = error_of(ended_once(request.get_response_sender()))
    assert error is not None and (error.status, error.type, error.code) == (500, "server_error", "internal_error")
    ended_once(after.get_response_sender())
    assert fake_engine.cancelled == ["unlucky"] and fake_engine.stopped


def test_a_request_the_engine_takes_is_answered_by_its_events(
    serve: Callable[..., Served], fake_engine: FakeEngine
) -> None:
    served = serve()
    request = chat_request("taken", stream=True, parameters={"max_tokens": 4})
    served.execute(request)
    (taken,) = fake_engine.wait_submitted(1)
    assert taken.request_id == "taken" and taken.stream and taken.params.max_tokens == 4
    sender = request.get_response_sender()
    assert sender.sent == []  # execute returned without answering: the engine's events do
    taken.sink(EngineEvent("taken", final=True))
    sender.wait_final()
    served.finalize()
    assert error_of(ended_once(sender)) is None
