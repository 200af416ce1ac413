"""``TritonPythonModel`` request by request: every request ends with exactly one final response.

Driven as Triton's stub drives it (initialize, execute, finalize) on the tiny model, with the
recording response sender of the fake ``triton_python_backend_utils``. Each test finalizes the
model before counting finals: the sender thread has stopped then, so nothing more can arrive.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from typing import Any

import pytest

from python_backend.engine import steps as steps_module
from python_backend.protocol import contract
from tests.adapter.model_driver import Served, chat_request, control_request, delta_of, ended_once, error_of, text_of

LONG = {"max_tokens": 4000, "ignore_eos": True}  # still generating when the test acts on it
LONG_SERVER = {"max_iter_times": "4096"}


def test_a_whole_response_is_one_final_response_with_all_its_text(serve: Callable[..., Served]) -> None:
    served = serve()
    request = chat_request("whole", parameters={"max_tokens": 6, "ignore_eos": True})
    sender = served.answer(request)
    served.finalize()
    final = ended_once(sender)
    assert sender.sent == [final]
    delta = delta_of(final)
    assert delta is not None and delta.text and delta.finish_reason == contract.FINISH_LENGTH
    assert delta.usage is not None and delta.usage.completion_tokens == 6


def test_start_up_objects_are_frozen_while_serving_and_stay_frozen_at_finalize(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    # Full collections while serving skip the model, tokenizer and imports (model/allocator.py).
    frozen = gc.get_freeze_count()
    assert frozen > 10_000
    request = chat_request("frozen", parameters={"max_tokens": 4, "ignore_eos": True})
    sender = served.answer(request)
    assert text_of(sender)  # and it serves
    served.finalize()
    # Still frozen (less what finalize let go): a last collection of them while Triton's stub
    # tore its own down crashed it.
    assert gc.get_freeze_count() > frozen // 2


def test_a_stream_is_several_deltas_then_one_final(serve: Callable[..., Served]) -> None:
    served = serve()
    request = chat_request("streamed", stream=True, parameters={"max_tokens": 6, "ignore_eos": True})
    sender = served.answer(request)
    served.finalize()
    ended_once(sender)
    deltas = [d for d in map(delta_of, sender.sent) if d is not None]
    assert len(deltas) >= 2  # one per token (stream_interval 1), not one at the end
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert deltas[-1].finish_reason == contract.FINISH_LENGTH


@pytest.mark.parametrize(
    ("raw", "param"),
    [("{not json", contract.PARAMETERS), (json.dumps({"max_tokens": 4, "no_such_key": 1}), "no_such_key")],
    ids=["bad-json", "unknown-key"],
)
def test_invalid_parameters_are_one_error_that_names_them(serve: Callable[..., Served], raw: str, param: str) -> None:
    served = serve()
    request = chat_request("invalid", raw_parameters=raw)
    served.execute(request)
    served.finalize()
    sender = request.get_response_sender()
    final = ended_once(sender)
    assert len(sender.sent) == 1
    error = error_of(final)
    assert error is not None and (error.status, error.param) == (400, param)


def test_a_step_that_raises_ends_its_request_with_an_internal_error(
    serve: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = steps_module.sample
    calls = [0]

    def sample_then_fail(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > 1:  # the first token (after prefill) is fine; the decode step then breaks
            raise RuntimeError("injected decode failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(steps_module, "sample", sample_then_fail)
    served = serve()
    request = chat_request("broken", stream=True, parameters={"max_tokens": 8, "ignore_eos": True})
    sender = served.answer(request)
    # The engine goes on serving: the probe still answers ready.
    probe = control_request(contract.HEALTH_PROBE, True, "probe")
    served.answer(probe)
    served.finalize()
    error = error_of(ended_once(sender))
    assert error is not None and (error.status, error.type, error.code) == (500, "server_error", "internal_error")
    assert json.loads(text_of(probe.get_response_sender()))["status"] == "ready"


def test_a_failed_engine_loop_fails_its_requests_and_the_probe(
    serve: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_step(self: Any) -> None:
        raise RuntimeError("injected loop failure")

    monkeypatch.setattr(steps_module.StepRunner, "decode_step", broken_step)
    served = serve()
    request = chat_request("doomed", parameters={"max_tokens": 8})
    served.answer(request)
    probe = control_request(contract.HEALTH_PROBE, True, "probe")
    later = chat_request("later", parameters={"max_tokens": 8})
    served.execute(probe, later)
    probe.get_response_sender().wait_final()
    later.get_response_sender().wait_final()
    served.finalize()
    for sender in (request.get_response_sender(), probe.get_response_sender(), later.get_response_sender()):
        error = error_of(ended_once(sender))
        assert error is not None and (error.status, error.code) == (503, "engine_failed")


def test_the_probe_answers_ready_with_the_engine_health(serve: Callable[..., Served]) -> None:
    served = serve()
    probe = control_request(contract.HEALTH_PROBE, True, "probe")
    served.answer(probe)
    served.finalize()
    final = ended_once(probe.get_response_sender())
    assert len(probe.get_response_sender().sent) == 1
    health = json.loads(text_of(probe.get_response_sender()))
    assert health["status"] == "ready" and health["running"] is True and health["failure"] is None
    assert delta_of(final) is not None


def test_a_client_that_goes_away_ends_its_request_early(serve: Callable[..., Served]) -> None:
    served = serve(**LONG_SERVER)
    request = chat_request("leaving", stream=True, parameters=LONG)
    served.execute(request)
    sender = request.get_response_sender()
    sender.wait_for(lambda sent: len(sent) >= 2)  # generating
    sender.cancel()
    sender.wait_final()
    served.finalize()
    final = ended_once(sender)
    assert error_of(final) is None  # a cancel is an end, not an error
    deltas = [d for d in map(delta_of, sender.sent) if d is not None]
    assert len(deltas) < LONG["max_tokens"]
    assert all(d.finish_reason is None for d in deltas)


def test_cancel_request_ends_the_named_request_and_itself(serve: Callable[..., Served]) -> None:
    served = serve(**LONG_SERVER)
    target = chat_request("target", stream=True, parameters=LONG)
    served.execute(target)
    target.get_response_sender().wait_for(lambda sent: len(sent) >= 2)
    cancel = control_request(contract.CANCEL_REQUEST, "target", "canceller")
    unknown = control_request(contract.CANCEL_REQUEST, "never-sent", "canceller-2")
    served.execute(cancel, unknown)
    target.get_response_sender().wait_final()
    cancel.get_response_sender().wait_final()
    unknown.get_response_sender().wait_final()
    served.finalize()
    assert error_of(ended_once(target.get_response_sender())) is None
    assert len([d for d in map(delta_of, target.get_response_sender().sent) if d is not None]) < LONG["max_tokens"]
    for sender in (cancel.get_response_sender(), unknown.get_response_sender()):
        assert [s.response for s in sender.sent] == [None]  # just the final flag
        ended_once(sender)


def test_finalize_ends_every_request_in_flight(serve: Callable[..., Served]) -> None:
    served = serve(**LONG_SERVER)
    running = chat_request("running", stream=True, parameters=LONG)
    served.execute(running)
    running.get_response_sender().wait_for(lambda sent: len(sent) >= 2)
    whole = chat_request("whole", parameters=LONG)  # not streamed: nothing sent before its end
    served.execute(whole)
    served.finalize()
    for request in (running, whole):
        error = error_of(ended_once(request.get_response_sender()))
        assert error is not None and (error.status, error.code) == (503, "shutting_down")
