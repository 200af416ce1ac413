"""Tool calls and reasoning through the real engine, on a tiny model trained to produce them.

Requests go the Triton model's way (the model's intake with its resolved formats, then
``Engine.submit``), so prefills, output plans and the per-sequence pipeline are all exercised.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from python_backend.engine.engine import Engine
from python_backend.intake.intake import Connection, Intake
from python_backend.model.loader import LoadedModel, load_model
from python_backend.protocol import contract
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.engine_driver import Collected
from tests.fixtures.trained_models import ANSWER, THINK_QUESTION, THOUGHT, TOOL_QUESTION, WEATHER_TOOL


@pytest.fixture(scope="module")
def trained(trained_model_dir: Path) -> LoadedModel:
    return load_model(EngineSettings(model_path=str(trained_model_dir), dtype="float32", device="cpu"))


@pytest.fixture
def engine(trained: LoadedModel, start_engine: Callable[..., Engine]) -> Engine:
    return start_engine(trained)


def run(
    engine: Engine, loaded: LoadedModel, content: str | None, stream: bool, raw_prompt: str = "", **params: Any
) -> Collected:
    tensors = {contract.STREAM: contract.bool_tensor(stream), contract.PARAMETERS: contract.json_tensor(params)}
    if content is not None:
        tensors[contract.MESSAGES] = contract.json_tensor([{"role": "user", "content": content}])
    else:
        tensors[contract.TEXT_INPUT] = contract.bytes_tensor(raw_prompt)
    # The model's intake, as every transport enters the engine: both parsers picked by evidence.
    settings = EngineSettings(model_path="unused", tool_call_parser="auto", reasoning_parser="auto")
    intake = Intake.for_model(loaded, settings)
    out = Collected()
    try:
        engine.submit(intake.from_inputs(f"tools-{uuid.uuid4().hex}", tensors, Connection(out.sink)))
        return out.wait()
    finally:
        intake.close()


def think_tokens(loaded: LoadedModel) -> int:
    return len(loaded.tokenizer.encode(f"<think>\n{THOUGHT}\n</think>", add_special_tokens=False))


def only_call(out: Collected) -> dict[str, Any]:
    """The one call of the answer; streamed, it comes whole in one delta entry."""
    entries = [entry for delta in out.deltas for entry in delta.tool_calls]
    assert len(entries) == 1, entries
    return entries[0]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_answer(engine: Engine, trained: LoadedModel, stream: bool) -> None:
    out = run(engine, trained, TOOL_QUESTION, stream, tools=[WEATHER_TOOL], temperature=0)
    assert out.error is None
    call = only_call(out)
    assert call["index"] == 0 and call["type"] == "function"
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert out.text() == "" and all(not d.reasoning for d in out.deltas)
    last = out.last()
    assert last.finish_reason == contract.FINISH_TOOL_CALLS
    assert last.usage is not None and last.usage.reasoning_tokens == 0  # a reasoning model that did not think


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_forced_tool_choice_prefills_a_call_the_model_completes(
    engine: Engine, trained: LoadedModel, tool_choice: Any
) -> None:
    out = run(engine, trained, TOOL_QUESTION, True, tools=[WEATHER_TOOL], tool_choice=tool_choice, temperature=0)
    call = only_call(out)
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    assert out.text() == "" and out.last().finish_reason == contract.FINISH_TOOL_CALLS


def test_tool_choice_none_is_plain_text(engine: Engine, trained: LoadedModel) -> None:
    out = run(
        engine, trained, TOOL_QUESTION, False, tools=[WEATHER_TOOL], tool_choice="none", temperature=0, max_tokens=20
    )
    assert not any(d.tool_calls for d in out.deltas)
    assert out.last().finish_reason in (contract.FINISH_STOP, contract.FINISH_LENGTH)


def test_call_cut_by_length_is_not_a_tool_call(engine: Engine, trained: LoadedModel) -> None:
    out = run(engine, trained, TOOL_QUESTION, False, tools=[WEATHER_TOOL], temperature=0, max_tokens=6)
    assert out.last().finish_reason == contract.FINISH_LENGTH
    assert not any(d.tool_calls for d in out.deltas)
    assert out.text().startswith("<tool_call>\n{")  # the unfinished call is shown as text


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_split_from_the_answer(engine: Engine, trained: LoadedModel, stream: bool) -> None:
    out = run(engine, trained, THINK_QUESTION, stream, temperature=0)
    reasoning = "".join(d.reasoning for d in out.deltas)
    assert (reasoning, out.text()) == (THOUGHT, ANSWER)
    last = out.last()
    assert last.finish_reason == contract.FINISH_STOP
    assert last.usage is not None and last.usage.reasoning_tokens == think_tokens(trained)
    assert last.usage.completion_tokens > last.usage.reasoning_tokens
    if stream:
        pieces = [d.reasoning + d.text for d in out.deltas]
        assert all("<" not in piece and "think>" not in piece for piece in pieces)
        first_content = next(i for i, d in enumerate(out.deltas) if d.text)
        assert not any(d.reasoning for d in out.deltas[first_content:])


def test_thinking_switched_off_parses_no_reasoning(engine: Engine, trained: LoadedModel) -> None:
    out = run(
        engine,
        trained,
        THINK_QUESTION,
        False,
        temperature=0,
        max_tokens=30,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert all(not d.reasoning for d in out.deltas)
    usage = out.last().usage
    assert usage is not None and usage.reasoning_tokens == 0


def test_thinking_opened_by_the_prompt_starts_as_reasoning(engine: Engine, trained: LoadedModel) -> None:
    prompt = f"<|im_start|>user\n{THINK_QUESTION}<|im_end|>\n<|im_start|>assistant\n<think>\n"
    out = run(engine, trained, None, True, raw_prompt=prompt, temperature=0)
    assert ("".join(d.reasoning for d in out.deltas), out.text()) == (THOUGHT, ANSWER)
    usage = out.last().usage
    # The prompt's "<think>\n" is not generated: the count starts with the thought itself.
    opened = len(trained.tokenizer.encode("<think>\n", add_special_tokens=False))
    assert usage is not None and usage.reasoning_tokens == think_tokens(trained) - opened


def test_grouped_stream_keeps_the_call_whole_and_the_reasoning_split(
    trained: LoadedModel, start_engine: Callable[..., Engine]
) -> None:
    engine = start_engine(trained, stream_interval=4)  # 4 tokens per streamed response
    tool = run(engine, trained, TOOL_QUESTION, True, tools=[WEATHER_TOOL], temperature=0)
    call = only_call(tool)
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert tool.text() == "" and tool.last().finish_reason == contract.FINISH_TOOL_CALLS
    think = run(engine, trained, THINK_QUESTION, True, temperature=0)
    assert ("".join(d.reasoning for d in think.deltas), think.text()) == (THOUGHT, ANSWER)
    assert all("<" not in d.reasoning + d.text and "think>" not in d.reasoning + d.text for d in think.deltas)
    usage = think.last().usage
    assert usage is not None and len(think.deltas) < usage.completion_tokens / 2
