"""The Llama 3.x JSON and Mistral formats through the real engine, on tiny models trained to call a
tool in each (tests/fixtures/trained_tool_formats.py): ``auto`` picks the parser from the chat
template, and the answer is a call whose streamed arguments parse, or plain text."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from python_backend.engine.engine import Engine
from python_backend.intake.intake import Connection, Intake, chat_inputs
from python_backend.model.loader import LoadedModel, load_model
from python_backend.protocol import contract
from python_backend.protocol.settings import EngineSettings
from python_backend.text.output_formats import resolve_formats
from tests.fixtures.engine_driver import Collected, make_engine
from tests.fixtures.trained_models import TOOL_QUESTION, WEATHER_TOOL
from tests.fixtures.trained_tool_formats import HELLO_QUESTION, HELLO_REPLY, build_tool_format_model

# Training the two models takes minutes of CPU.
pytestmark = [pytest.mark.model, pytest.mark.slow]

CALL_IDS = {"llama3_json": re.compile(r"call_[0-9a-f]{24}"), "mistral": re.compile(r"[A-Za-z0-9]{9}")}


@pytest.fixture(scope="module", params=["llama3_json", "mistral"])
def trained(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, LoadedModel, Engine]]:
    name: str = request.param
    folder = build_tool_format_model(tmp_path_factory.mktemp(f"trained-{name}"), name)
    loaded = load_model(EngineSettings(model_path=str(folder), dtype="float32", device="cpu"))
    engine = make_engine(loaded)
    yield name, loaded, engine
    engine.stop()


def run(engine: Engine, loaded: LoadedModel, question: str, stream: bool, **params: Any) -> Collected:
    """One chat request through the model's intake (the tool parser from the chat template, no
    reasoning parser) and the engine."""
    settings = EngineSettings(model_path="unused", tool_call_parser="auto", reasoning_parser="none")
    intake = Intake.for_model(loaded, settings)
    out = Collected()
    try:
        inputs = chat_inputs([{"role": "user", "content": question}], params, stream)
        engine.submit(intake.from_inputs(f"formats-{uuid.uuid4().hex}", inputs, Connection(out.sink)))
        return out.wait()
    finally:
        intake.close()


def test_auto_picks_the_format_from_the_chat_template(trained: tuple[str, LoadedModel, Engine]) -> None:
    name, loaded, _ = trained
    assert resolve_formats("auto", "none", loaded.tokenizer, loaded.model_type).tool_parser == name


@pytest.mark.parametrize("stream", [False, True])
def test_the_trained_call_comes_out_as_a_tool_call(trained: tuple[str, LoadedModel, Engine], stream: bool) -> None:
    name, loaded, engine = trained
    out = run(engine, loaded, TOOL_QUESTION, stream, tools=[WEATHER_TOOL], temperature=0)
    assert out.error is None
    entries = [entry for delta in out.deltas for entry in delta.tool_calls]
    assert len(entries) == 1, entries
    call = entries[0]
    assert CALL_IDS[name].fullmatch(call["id"]) and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}  # whole, so it always parses
    assert out.text() == ""
    assert out.last().finish_reason == contract.FINISH_TOOL_CALLS


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_forced_tool_choice_is_completed_by_the_model(
    trained: tuple[str, LoadedModel, Engine], tool_choice: Any
) -> None:
    _, loaded, engine = trained
    out = run(engine, loaded, TOOL_QUESTION, True, tools=[WEATHER_TOOL], tool_choice=tool_choice, temperature=0)
    calls = [entry["function"] for delta in out.deltas for entry in delta.tool_calls]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert out.last().finish_reason == contract.FINISH_TOOL_CALLS


def test_a_plain_answer_stays_content(trained: tuple[str, LoadedModel, Engine]) -> None:
    _, loaded, engine = trained
    out = run(engine, loaded, HELLO_QUESTION, True, tools=[WEATHER_TOOL], temperature=0)
    assert out.text() == HELLO_REPLY and all(not d.tool_calls for d in out.deltas)
    assert out.last().finish_reason == contract.FINISH_STOP
