"""What every tool-call parser shares: the parsed call, the parser interface, hold-back helpers.

Owns: ``ToolCall`` (one complete call, with its ``call_<24 hex>`` id and its OpenAI forms) and
the readers of a call's JSON (``json_object``, ``call_from_json``, ``call_from_object``),
``ParserOutput``, the ``ToolParser`` protocol (fed text deltas after detokenization, returns the
content that is safe to show and the calls completed so far), ``SteppedToolParser``, the feed
and finish driver of the parsers written as a state machine over a text buffer (with the moves
they share: release content up to a tag, skip the space after a call), ``held_prefix``, the
rule that holds text back only while it could still be the start of a tag, and ``JsonEnd``,
which finds where a streamed JSON object or array closes.
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol


def new_call_id() -> str:
    """OpenAI-style id: ``call_`` and 24 hex digits (96 random bits)."""
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolCall:
    """One complete tool call; ``arguments`` is always a JSON text that parses to an object."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)

    def message_form(self) -> dict[str, Any]:
        """The ``message.tool_calls[i]`` object of a non-streaming answer."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def delta_form(self, index: int) -> dict[str, Any]:
        """The streaming ``delta.tool_calls[i]`` entry: the whole call at once, so the
        concatenated ``arguments`` of a stream always parse as JSON."""
        return {"index": index, **self.message_form()}


def json_object(body: str) -> dict[str, Any] | None:
    """``body`` decoded when it is a JSON object; None when it is anything else (model output is
    never an error: the caller releases such text as content)."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def call_from_json(body: str, keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall | None:
    """A call from the JSON text of ``{"name": ..., <arguments>: {...}}``, its arguments under the
    first of ``keys`` it has (formats differ in which name they write, and models in which they
    use); None when it is not one."""
    data = json_object(body)
    if data is None:
        return None
    arguments = next((data[key] for key in keys if key in data), None)
    return call_from_object(data.get("name"), arguments)


def call_from_object(name: Any, arguments: Any) -> ToolCall | None:
    """A call from a decoded name and arguments, or None when they do not make a valid call.

    Arguments may be an object, a JSON text of an object (some models quote them), or absent.
    """
    if not isinstance(name, str) or not name.strip():
        return None
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(name=name.strip(), arguments=json.dumps(arguments, ensure_ascii=False))


@dataclass
class ParserOutput:
    """What one ``feed``/``finish`` released: content text and newly completed calls."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def extend(self, other: ParserOutput) -> None:
        self.content += other.content
        self.calls.extend(other.calls)


class ToolParser(Protocol):
    """Incremental parser of one sequence's output. Never raises on model output: text that is
    not a well-formed call comes back as content."""

    def feed(self, text: str) -> ParserOutput:
        """Add the next text delta; return what is certain now."""
        ...

    def finish(self) -> ParserOutput:
        """The sequence ended: release everything still held (an unfinished call as content)."""
        ...


class SteppedToolParser(ABC):
    """A parser written as a state machine over ``_buffer``, the text not yet released.

    ``feed`` appends a delta and calls ``_step`` until it must wait for more text; ``finish``
    hands what is still buffered to ``_finish``. A subclass sets its own state first and then
    calls ``super().__init__(prefill)``: the prefill (call text the prompt already ends with) is
    parsed at once, as if the model had written it, and what it releases comes out with the
    first ``feed``.
    """

    def __init__(self, prefill: str = "") -> None:
        self._buffer = ""
        self._carry = ParserOutput()
        if prefill:
            self._carry = self.feed(prefill)

    def feed(self, text: str) -> ParserOutput:
        out, self._carry = self._carry, ParserOutput()
        self._buffer += text
        while self._step(out):
            pass
        return out

    def finish(self) -> ParserOutput:
        out, self._carry = self._carry, ParserOutput()
        rest, self._buffer = self._buffer, ""
        self._finish(rest, out)
        return out

    def _content_until(self, tag: str, out: ParserOutput) -> bool:
        """Release the content before ``tag``: True when it was found (the buffer now starts with
        it); False when it was not, with only a tail that may still become ``tag`` held back."""
        start = self._buffer.find(tag)
        cut = start if start >= 0 else len(self._buffer) - held_prefix(self._buffer, (tag,))
        out.content += self._buffer[:cut]
        self._buffer = self._buffer[cut:]
        return start >= 0

    def _skip_space(self) -> bool:
        """Drop the buffer's leading whitespace (what follows a call); False when nothing else is
        buffered yet."""
        self._buffer = self._buffer.lstrip()
        return bool(self._buffer)

    @abstractmethod
    def _step(self, out: ParserOutput) -> bool:
        """Consume what the buffer allows, adding to ``out``; False when it must wait for more text."""

    @abstractmethod
    def _finish(self, rest: str, out: ParserOutput) -> None:
        """The sequence ended with ``rest`` still buffered (the buffer is already empty)."""


def held_prefix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``tags``."""
    best = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:size]):
                best = size
                break
    return best


class JsonEnd:
    """Where a JSON object or array that starts at offset ``start`` of a growing text ends.

    Incremental: each ``scan`` resumes where the last stopped (no rescanning, so a long value
    costs O(n) over the whole stream). Only brackets outside strings count; whether the value
    is valid JSON is the caller's ``json.loads``.
    """

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self._pos = start
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def scan(self, text: str) -> int | None:
        """The end (exclusive) of the value in ``text``, or None while it is still open."""
        for i in range(self._pos, len(text)):
            ch = text[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._pos = i + 1
                    return i + 1
        self._pos = len(text)
        return None
