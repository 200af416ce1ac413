"""The intake: contract inputs in, the engine's request out, as a caller without a transport uses it."""

from __future__ import annotations

import json

import pytest

from python_backend.intake.intake import Connection, Intake, chat_inputs
from python_backend.model.loader import LoadedModel
from python_backend.protocol.errors import ContractError
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.engine_driver import Collected, Driver


@pytest.fixture(scope="module")
def intake(tiny_loaded: LoadedModel) -> Intake:
    return Intake.for_model(tiny_loaded, EngineSettings())


def test_a_chat_request_gets_its_template_and_its_grammar(intake: Intake, driver: Driver) -> None:
    messages = [{"role": "user", "content": "yes or no?"}]
    schema = {
        "type": "object",
        "properties": {"a": {"type": "boolean"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    parameters = {"response_format": response_format, "temperature": 1.0, "seed": 3, "max_tokens": 40}
    out = Collected()
    request = intake.from_inputs("intake-json", chat_inputs(messages, parameters), Connection(out.sink))
    assert request.prompt_ids == driver.prompt_ids("yes or no?")  # the chat template, as served
    assert request.grammar is not None and request.stream
    driver.engine.submit(request)
    text = out.wait().text()
    assert out.last().finish_reason == "stop"
    assert set(json.loads(text)) == {"a"}  # the grammar held


def test_a_bad_parameter_is_refused_naming_it(intake: Intake) -> None:
    inputs = chat_inputs([{"role": "user", "content": "hi"}], {"temperature": -1})
    with pytest.raises(ContractError) as caught:
        intake.from_inputs("intake-bad", inputs, Connection(lambda _event: None))
    assert caught.value.info.param == "temperature"
