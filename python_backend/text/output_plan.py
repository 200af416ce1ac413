"""How one request's generated text is read: reasoning split, then tool-call parsing.

Owns: ``OutputPlan`` (per request, decided once by ``output_formats.plan_output``) and
``OutputPipeline`` (per sequence: text -> reasoning splitter -> tool-call parser -> the content,
reasoning and tool-call deltas a ``ChoiceDelta`` carries). The default plan parses nothing, so a
request built without one (raw engine use) behaves as plain text generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from python_backend.text.reasoning import ReasoningSplitter
from python_backend.text.tool_parsers import ToolParser, make_tool_parser

REASONING_OFF = "off"  # no reasoning parsing: all text is content
REASONING_DETECT = "detect"  # reasoning only if the output starts with <think>
REASONING_FORCED = "forced"  # the prompt ends inside an open <think>: output starts as reasoning


@dataclass(frozen=True)
class OutputPlan:
    """What to parse in one request's output."""

    tool_parser: str | None = None  # a name from tool_parsers.TOOL_PARSERS; None: no tool calls
    tool_names: frozenset[str] = frozenset()  # the request's function names
    tool_prefill: str = ""  # call text the prompt already ends with (tool_choice required/named)
    max_tool_calls: int | None = None  # parallel_tool_calls false: 1 (later calls are dropped)
    reasoning: str = REASONING_OFF
    report_reasoning_tokens: bool = False  # the model has a reasoning format: usage counts them


class OutputPipeline:
    """One sequence's text, sorted into content, reasoning and complete tool calls."""

    def __init__(self, plan: OutputPlan) -> None:
        self._splitter = (
            ReasoningSplitter(plan.reasoning == REASONING_FORCED) if plan.reasoning != REASONING_OFF else None
        )
        self._parser: ToolParser | None = (
            make_tool_parser(plan.tool_parser, plan.tool_names, plan.tool_prefill) if plan.tool_parser else None
        )
        self._report_reasoning = plan.report_reasoning_tokens
        self._max_calls = plan.max_tool_calls
        self._text = ""
        self._reasoning = ""
        self._calls: list[dict[str, Any]] = []
        self.call_count = 0  # complete calls produced so far

    def feed(self, text: str, tokens: int = 1) -> None:
        """The text of ``tokens`` new tokens (0 for text released at the end, e.g. a flush)."""
        if self._splitter is not None:
            split = self._splitter.feed(text, tokens)
            self._reasoning += split.reasoning
            text = split.content
        self._content(text, final=False)

    def finish(self) -> None:
        """The sequence ended: release everything every stage still holds."""
        text = ""
        if self._splitter is not None:
            split = self._splitter.finish()
            self._reasoning += split.reasoning
            text = split.content
        self._content(text, final=True)

    def _content(self, text: str, final: bool) -> None:
        if self._parser is None:
            self._text += text
            return
        out = self._parser.feed(text) if text else None
        for part in (out, self._parser.finish() if final else None):
            if part is None:
                continue
            self._text += part.content
            for call in part.calls:
                if self._max_calls is not None and self.call_count >= self._max_calls:
                    break  # as vLLM: calls past the limit are dropped, not shown as text
                self._calls.append(call.delta_form(self.call_count))
                self.call_count += 1

    def take(self) -> tuple[str, str, list[dict[str, Any]]]:
        """Content, reasoning and tool-call deltas produced since the last call."""
        taken = (self._text, self._reasoning, self._calls)
        self._text, self._reasoning, self._calls = "", "", []
        return taken

    @property
    def reasoning_tokens(self) -> int | None:
        """None when the model has no reasoning format (usage then omits the field)."""
        if not self._report_reasoning:
            return None
        return self._splitter.reasoning_tokens if self._splitter is not None else 0
