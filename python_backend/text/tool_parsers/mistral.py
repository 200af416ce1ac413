"""The Mistral ``[TOOL_CALLS]`` tool-call format.

Owns: ``MistralToolParser`` and ``mistral_call_id``. Mistral's models write calls after the
``[TOOL_CALLS]`` token, in one of two shapes:

* a JSON list of ``{"name": ..., "arguments": {...}}`` objects (Mistral 7B v0.3, Mixtral,
  Nemo), or a single such object;
* ``<name>[ARGS]{...}`` (newer tokenizers), one call per ``[TOOL_CALLS]``.

Text before ``[TOOL_CALLS]`` is content; whitespace right after a call is not. ``arguments`` may
also be spelled ``parameters``, or be a JSON text of an object. A value that is not such a call
(or not JSON) is content, marker included, and so is a call still open when the sequence ends.
The markers are special tokens, so a request parsed with this format is decoded with special
tokens kept. Call ids are 9 letters and digits: Mistral's templates refuse any other id when the
call comes back in the conversation.

A call is released once its JSON closes (whole, so streamed arguments always parse). Text is
held only while it could still be a marker, and inside a call until it closes.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import replace
from typing import Any

from python_backend.text.tool_parsers.base import (
    JsonEnd,
    ParserOutput,
    SteppedToolParser,
    ToolCall,
    call_from_object,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_ID_ALPHABET = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    """Nine random letters and digits (about 53 bits), the id shape Mistral's templates accept."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


def _call(name: Any, arguments: Any) -> ToolCall | None:
    call = call_from_object(name, arguments)
    return None if call is None else replace(call, id=mistral_call_id())


def _calls_in(value: Any) -> list[ToolCall] | None:
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return None
        call = _call(item.get("name"), item.get("arguments", item.get("parameters")))
        if call is None:
            return None
        calls.append(call)
    return calls or None


class MistralToolParser(SteppedToolParser):
    """Incremental ``[TOOL_CALLS]`` parser for one sequence (in a call, ``_buffer`` starts with
    the marker)."""

    def __init__(self, prefill: str = "") -> None:
        self._in_call = False
        self._name: str | None = None  # the ``<name>[ARGS]`` shape's name, once read
        self._value: JsonEnd | None = None  # the call's JSON, once it started
        self._after_call = False  # swallowing whitespace that follows a call
        super().__init__(prefill)

    def _step(self, out: ParserOutput) -> bool:
        """One move of the state machine; False when it must wait for more text."""
        if self._in_call:
            return self._call_step(out)
        if self._after_call:
            if not self._skip_space():
                return False
            self._after_call = False
        self._in_call = self._content_until(TOOL_CALLS, out)
        return self._in_call

    def _value_start(self) -> int | None:
        """Where the call's JSON starts in the buffer (None: not yet known, or not a call: -1)."""
        at = len(self._buffer) - len(self._buffer[len(TOOL_CALLS) :].lstrip())
        if at == len(self._buffer):
            return None
        if self._buffer[at] in "[{":
            return at
        args = self._buffer.find(ARGS, at)
        if args < 0:
            return None
        self._name = self._buffer[at:args].strip()
        body = args + len(ARGS)
        at = len(self._buffer) - len(self._buffer[body:].lstrip())
        if at == len(self._buffer):
            return None
        return at if self._buffer[at] == "{" else -1

    def _call_step(self, out: ParserOutput) -> bool:
        if self._value is None:
            start = self._value_start()
            if start is None:
                return False
            if start < 0:
                self._release(out, len(self._buffer))
                return True
            self._value = JsonEnd(start)
        end = self._value.scan(self._buffer)
        if end is None:
            return False
        calls = self._parse(self._buffer[self._value.start : end])
        if calls is None:
            self._release(out, end)
        else:
            out.calls.extend(calls)
            self._buffer = self._buffer[end:]
            self._reset(after_call=True)
        return True

    def _parse(self, body: str) -> list[ToolCall] | None:
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return None
        if self._name is not None:
            call = _call(self._name, value)
            return None if call is None else [call]
        return _calls_in(value)

    def _release(self, out: ParserOutput, end: int) -> None:
        """Not a call after all: the text up to ``end``, marker included, is content."""
        out.content += self._buffer[:end]
        self._buffer = self._buffer[end:]
        self._reset(after_call=False)

    def _reset(self, after_call: bool) -> None:
        self._in_call, self._name, self._value, self._after_call = False, None, None, after_call

    def _finish(self, rest: str, out: ParserOutput) -> None:
        if not self._after_call:
            out.content += rest
        self._reset(after_call=False)
