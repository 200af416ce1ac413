"""The Llama 3.x JSON tool-call format.

Owns: ``Llama3JsonToolParser``. Llama 3.1-3.3's templates ask for a call as a bare JSON object,
``{"name": <function>, "parameters": {...}}``, as the whole answer; the model may open it with
``<|python_tag|>`` (the built-in tools' marker) and may write several calls separated by ``;``.
Accepted details:

* An answer that starts (after whitespace) with ``{`` or ``<|python_tag|>`` is a run of calls;
  ``<|python_tag|>`` later in the text starts one as well, the text before it being content.
* ``parameters`` may also be spelled ``arguments``, may be a JSON text of an object, or absent;
  ``function.arguments`` is always re-serialised with ``json.dumps``.
* A JSON value that is not such an object (or is not JSON) is content, marker included, and so
  is anything after the calls that does not start another one; a call still open when the
  sequence ends is content.

A call is released once its object closes (whole, so streamed arguments always parse). Text is
held only while it could still start a call.
"""

from __future__ import annotations

from python_backend.text.tool_parsers.base import (
    JsonEnd,
    ParserOutput,
    SteppedToolParser,
    call_from_json,
)

PYTHON_TAG = "<|python_tag|>"
_SEPARATORS = " \t\r\n;"


class Llama3JsonToolParser(SteppedToolParser):
    """Incremental parser of ``{"name": ..., "parameters": ...}`` calls for one sequence."""

    def __init__(self, prefill: str = "") -> None:
        self._started = False  # the answer's first visible character has been seen
        self._calls = False  # inside a run of calls: the buffer starts at a call or separator
        self._value: JsonEnd | None = None  # an open call object at the buffer's start
        super().__init__(prefill)

    def _step(self, out: ParserOutput) -> bool:
        """One move of the state machine; False when it must wait for more text."""
        if self._value is not None:
            return self._close_value(out)
        if not self._started:
            head = self._buffer.lstrip()
            if not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG):
                return False  # leading whitespace, or a marker still arriving
            self._started = True
            self._calls = head.startswith(("{", PYTHON_TAG))
            if not self._calls:
                return True
            self._buffer = head
        if self._calls:
            return self._next_call(out)
        self._calls = self._content_until(PYTHON_TAG, out)
        return self._calls

    def _next_call(self, out: ParserOutput) -> bool:
        rest = self._buffer.lstrip(_SEPARATORS)
        marker = rest.startswith(PYTHON_TAG)
        body = rest[len(PYTHON_TAG) :].lstrip() if marker else rest
        if not body:
            return False  # separators or a marker only, so far: the next call may follow
        if not marker and PYTHON_TAG.startswith(body) and body != PYTHON_TAG:
            return False
        if not body.startswith("{"):
            self._buffer, self._calls = rest, False  # text after the calls
            return True
        self._buffer = rest  # kept whole (marker included) in case the call is not valid
        self._value = JsonEnd(len(rest) - len(body))
        return True

    def _close_value(self, out: ParserOutput) -> bool:
        value = self._value
        end = value.scan(self._buffer) if value is not None else None
        if value is None or end is None:
            return False
        raw, self._buffer = self._buffer[:end], self._buffer[end:]
        self._value = None
        call = call_from_json(raw[value.start :], ("parameters", "arguments"))
        if call is None:
            out.content += raw
            self._calls = False
        else:
            out.calls.append(call)
        return True

    def _finish(self, rest: str, out: ParserOutput) -> None:
        if self._value is not None or not self._calls or rest.strip(_SEPARATORS):
            out.content += rest
        self._value = None
