"""The ChatGLM3-6B tool-call format.

Owns: ``ChatGLM3ToolParser``. ChatGLM3 (THUDM/ChatGLM3, PROMPT_en.md) writes each assistant turn
as ``<|assistant|>{metadata}\\n{content}``; the prompt ends with ``<|assistant|>``, so the output
starts with the metadata line. A turn whose metadata is a function name is a call::

    get_weather
    ```python
    tool_call(city="Paris", days=2)
    ```

and generation then stops at ``<|observation|>`` (an EOS id of the model). An answer may hold
several turns, separated by ``<|assistant|>``, e.g. a sentence, then a call. The tags are special
tokens, so a request parsed with this format is decoded with special tokens kept.

Accepted exactly:

* Turns are split at ``<|assistant|>`` and ``<|observation|>`` (both removed from the text).
* Metadata (the first line, stripped) empty: the rest of the turn is content, leading
  whitespace dropped (as ChatGLM3's own ``process_response`` strips it).
* Metadata equal to the name of one of the request's tools: a call. Its body, without an
  optional ```` ``` ```` / ```` ```python ```` fence, is either ``tool_call(k=v, ...)`` with
  keyword arguments whose values are Python literals (read with ``ast.literal_eval``, never
  ``eval``: ChatGLM3's demo ``eval``s model output, which would run arbitrary code), or a JSON
  object. Anything else (positional arguments, expressions, bad JSON) returns the turn as
  content, metadata line included.
* Any other metadata (``interpreter``, or an answer without the leading newline): the whole
  turn, metadata included, is content.

A call is released when its turn ends (the next tag or the end of the sequence). Text is held
only while it could still be a tag, or a first line that could still be a tool's name.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from python_backend.text.tool_parsers.base import (
    ParserOutput,
    SteppedToolParser,
    ToolCall,
    call_from_object,
    held_prefix,
)

TURN_TAGS = ("<|assistant|>", "<|observation|>")
_HEAD, _PLAIN, _CALL = "head", "plain", "call"


def _unfence(body: str) -> str:
    lines = body.strip().split("\n")
    if lines and lines[0].strip().startswith("```"):
        lines = lines[1:]
    if lines and lines[-1].strip() == "```":
        lines = lines[:-1]
    return "\n".join(lines).strip()


def _keyword_arguments(text: str) -> dict[str, Any] | None:
    """``tool_call(a=1, b="x")`` -> ``{"a": 1, "b": "x"}`` without evaluating anything."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    call = tree.body
    if not isinstance(call, ast.Call) or call.args or any(k.arg is None for k in call.keywords):
        return None
    values: dict[str, Any] = {}
    for keyword in call.keywords:
        try:
            values[str(keyword.arg)] = ast.literal_eval(keyword.value)
        except ValueError:
            return None
    try:
        json.dumps(values)  # literals such as sets or bytes have no JSON form
    except TypeError:
        return None
    return values


def _parse_call(name: str, body: str) -> ToolCall | None:
    text = _unfence(body)
    if text.startswith("{"):
        try:
            return call_from_object(name, json.loads(text))
        except json.JSONDecodeError:
            return None
    arguments = _keyword_arguments(text)
    return None if arguments is None else call_from_object(name, arguments)


class ChatGLM3ToolParser(SteppedToolParser):
    """Incremental parser of ChatGLM3 turns for one sequence."""

    def __init__(self, tool_names: frozenset[str], prefill: str = "") -> None:
        self._names = tool_names
        self._state = _HEAD
        self._metadata = ""
        self._scan_from = 0  # a call's body before this offset holds no turn tag
        self._strip_leading = False  # a content turn drops its leading whitespace
        # A named tool_choice prefills "name\n" after the prompt's <|assistant|>.
        super().__init__(prefill)

    def _could_be_name(self, text: str) -> bool:
        head = text.strip()
        return not head or any(name.startswith(head) for name in self._names)

    def _find_tag(self, start: int = 0) -> tuple[int, str]:
        found = [(at, t) for t in TURN_TAGS if (at := self._buffer.find(t, start)) >= 0]
        return min(found, default=(-1, ""))

    def _step(self, out: ParserOutput) -> bool:
        """Consume what the buffer allows in the current state; True when the state changed."""
        if self._state == _CALL:
            # A call's body only grows until its turn ends: never rescan what was searched.
            tag_at, tag = self._find_tag(self._scan_from)
            if tag_at < 0:
                self._scan_from = max(len(self._buffer) - max(map(len, TURN_TAGS)) + 1, 0)
                return False
            self._end_call(self._buffer[:tag_at], out)
            self._buffer = self._buffer[tag_at + len(tag) :]
            return True
        tag_at, tag = self._find_tag()
        if self._state == _HEAD:
            newline = self._buffer.find("\n")
            line_end = newline if newline >= 0 else len(self._buffer)
            if 0 <= tag_at < line_end:  # a turn that ended inside its metadata line
                out.content += self._buffer[:tag_at]
                self._buffer = self._buffer[tag_at + len(tag) :]
                return True
            if newline < 0:
                if self._could_be_name(self._buffer):
                    return False
                self._state = _PLAIN  # not a tool's name: the line is content
                return True
            metadata = self._buffer[:newline].strip()
            if not metadata:
                self._buffer = self._buffer[newline + 1 :]
                self._state, self._strip_leading = _PLAIN, True
            elif metadata in self._names:
                self._buffer = self._buffer[newline + 1 :]
                self._state, self._metadata, self._scan_from = _CALL, metadata, 0
            else:
                self._state = _PLAIN
            return True
        # _PLAIN
        if self._strip_leading:
            self._buffer = self._buffer.lstrip()
            if not self._buffer:
                return False
            self._strip_leading = False
        if tag_at >= 0:
            out.content += self._buffer[:tag_at]
            self._buffer = self._buffer[tag_at + len(tag) :]
            self._state = _HEAD
            return True
        cut = len(self._buffer) - held_prefix(self._buffer, TURN_TAGS)
        out.content += self._buffer[:cut]
        self._buffer = self._buffer[cut:]
        return False

    def _end_call(self, body: str, out: ParserOutput) -> None:
        call = _parse_call(self._metadata, body)
        if call is None:
            out.content += f"{self._metadata}\n{body}"
        else:
            out.calls.append(call)
        self._state, self._metadata = _HEAD, ""

    def _finish(self, rest: str, out: ParserOutput) -> None:
        if self._state == _CALL:
            self._end_call(rest, out)
        elif not (self._state == _PLAIN and self._strip_leading):
            out.content += rest
