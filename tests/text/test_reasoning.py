"""``<think>`` splitting on golden outputs fed token by token, and the per-sequence output pipeline."""

from __future__ import annotations

import json
from typing import Any

from python_backend.text.output_plan import REASONING_DETECT, REASONING_FORCED, OutputPipeline, OutputPlan
from python_backend.text.reasoning import ReasoningSplitter
from tests.fixtures.token_stream import token_deltas


def split(tok: Any, text: str | list[str], forced: bool = False) -> tuple[str, str, int, list[str]]:
    """(reasoning, content, reasoning tokens, content released per token) for a generated text."""
    splitter = ReasoningSplitter(forced)
    deltas = token_deltas(tok, text)
    reasoning = content = ""
    released = []
    for i, delta in enumerate(deltas):
        out = splitter.feed(delta, tokens=0 if i == len(deltas) - 1 else 1)  # the last one is the flush
        reasoning += out.reasoning
        content += out.content
        released.append(out.reasoning + out.content)
    end = splitter.finish()
    return reasoning + end.reasoning, content + end.content, splitter.reasoning_tokens, released


def n_tokens(tok: Any, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def test_thinking_then_answer(tiny_tokenizer: Any) -> None:
    thought = "<think>\nThe user wants the capital. 你好!\n</think>"
    reasoning, content, count, _ = split(tiny_tokenizer, thought + "\n\nParis is the capital.")
    assert reasoning == "The user wants the capital. 你好!"
    assert content == "Paris is the capital."
    assert count == n_tokens(tiny_tokenizer, thought)  # both tags included, the answer not


def test_output_not_starting_with_think_is_all_content(tiny_tokenizer: Any) -> None:
    text = "Paris. <think>not a thought</think> still the answer"
    assert split(tiny_tokenizer, text)[:3] == ("", text, 0)
    assert split(tiny_tokenizer, "\n\n<think>x</think>y")[:2] == ("x", "y")  # leading blank lines are fine


def test_forced_thinking_started_by_the_template(tiny_tokenizer: Any) -> None:
    reasoning, content, count, _ = split(tiny_tokenizer, "\nStep one.\n</think>\n\nAnswer.", forced=True)
    assert (reasoning, content) == ("Step one.", "Answer.")
    assert count == n_tokens(tiny_tokenizer, "\nStep one.\n</think>")


def test_missing_close_tag_stays_reasoning(tiny_tokenizer: Any) -> None:
    assert split(tiny_tokenizer, "<think>\nstill thinking when cut")[:2] == ("still thinking when cut", "")
    assert split(tiny_tokenizer, "never closed", forced=True)[:2] == ("never closed", "")


def test_tags_split_over_tokens_never_leak(tiny_tokenizer: Any) -> None:
    pieces = ["<th", "ink>", "\nhmm, ok\n", "</th", "ink>", "\n\nanswer"]
    reasoning, content, count, released = split(tiny_tokenizer, pieces)
    assert (reasoning, content) == ("hmm, ok", "answer")
    assert all("<" not in piece and "think" not in piece for piece in released)
    assert count == sum(n_tokens(tiny_tokenizer, piece) for piece in pieces[:5])  # "<th" counted once known


def test_content_is_not_held_when_it_cannot_be_a_tag() -> None:
    splitter = ReasoningSplitter(forced=False)
    assert splitter.feed("Hi").content == "Hi"
    assert splitter.feed(" <think>").content == " <think>"
    assert splitter.reasoning_tokens == 0


def test_pipeline_reasoning_then_tool_call(tiny_tokenizer: Any) -> None:
    text = (
        "<think>\nI need the weather tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    pipeline = OutputPipeline(
        OutputPlan(tool_parser="hermes", reasoning=REASONING_DETECT, report_reasoning_tokens=True)
    )
    deltas = token_deltas(tiny_tokenizer, text)
    for delta in deltas[:-1]:
        pipeline.feed(delta)
    pipeline.feed(deltas[-1], tokens=0)
    pipeline.finish()
    content, reasoning, calls = pipeline.take()
    assert (content, reasoning) == ("", "I need the weather tool.")
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "get_weather", {"city": "Paris"})
    ]
    assert pipeline.call_count == 1
    assert pipeline.reasoning_tokens == n_tokens(tiny_tokenizer, "<think>\nI need the weather tool.\n</think>")


def test_pipeline_reasoning_tokens_reported_only_for_reasoning_models() -> None:
    assert OutputPipeline(OutputPlan()).reasoning_tokens is None
    assert OutputPipeline(OutputPlan(report_reasoning_tokens=True)).reasoning_tokens == 0
    forced = OutputPipeline(OutputPlan(reasoning=REASONING_FORCED, report_reasoning_tokens=True))
    forced.feed("a")
    forced.feed("b")
    assert forced.reasoning_tokens == 2


def test_one_character_at_a_time_gives_the_same_split() -> None:
    text = "\n<think>\nfirst, then\n</think>\n\nthe answer </think> stays"
    for pieces in ([text], list(text)):
        splitter = ReasoningSplitter(forced=False)
        outs = [splitter.feed(piece) for piece in pieces] + [splitter.finish()]
        reasoning = "".join(o.reasoning for o in outs)
        content = "".join(o.content for o in outs)
        assert (reasoning, content) == ("first, then", "the answer </think> stays")
