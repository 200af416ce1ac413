"""The Hermes / Qwen2.5 tool-call format.

Owns: ``HermesToolParser``. A call is ``<tool_call>`` + a JSON object ``{"name": ..., "arguments":
{...}}`` + ``</tool_call>`` (Qwen2.5, Qwen3, Hermes 2/3 and their templates). Several calls may
follow each other; text before and between calls is content. Accepted details:

* ``arguments`` may also be spelled ``parameters``, may be a JSON text of an object, or absent
  (``{}``); ``function.arguments`` is always re-serialised with ``json.dumps``.
* Whitespace right after ``</tool_call>`` (the newline between calls) is not content.
* A call whose body is not such an object is returned as content, tags included, never raised.
* A call still open when the sequence ends counts if its body is already a complete, valid
  object (a model that stops right after the JSON); otherwise it is content.

Text is held back only while its tail could be the start of ``<tool_call>``, and inside a call
until the call closes (a call is emitted whole, once).
"""

from __future__ import annotations

from python_backend.text.tool_parsers.base import (
    ParserOutput,
    SteppedToolParser,
    call_from_json,
)

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class HermesToolParser(SteppedToolParser):
    """Incremental ``<tool_call>{json}</tool_call>`` parser for one sequence (in a call,
    ``_buffer`` is the call's body so far)."""

    def __init__(self, prefill: str = "") -> None:
        self._in_call = False
        self._scan_from = 0  # an open call's body before this offset holds no closing tag
        self._after_call = False  # swallowing whitespace that follows a call
        super().__init__(prefill)

    def _step(self, out: ParserOutput) -> bool:
        """One move of the state machine; False when it must wait for more text."""
        if self._in_call:
            end = self._buffer.find(CLOSE_TAG, self._scan_from)
            if end < 0:
                # Incomplete: hold all of it, and never rescan what was searched (no O(n^2)).
                self._scan_from = max(len(self._buffer) - len(CLOSE_TAG) + 1, 0)
                return False
            body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE_TAG) :]
            self._close_call(body, out, closed=True)
            return True
        if self._after_call:
            if not self._skip_space():
                return False
            self._after_call = False
        if not self._content_until(OPEN_TAG, out):
            return False
        self._buffer = self._buffer[len(OPEN_TAG) :]
        self._in_call, self._scan_from = True, 0
        return True

    def _close_call(self, body: str, out: ParserOutput, closed: bool) -> None:
        self._in_call = False
        call = call_from_json(body.strip())
        if call is None:
            out.content += OPEN_TAG + body + (CLOSE_TAG if closed else "")
        else:
            out.calls.append(call)
            self._after_call = True

    def _finish(self, rest: str, out: ParserOutput) -> None:
        if self._in_call:
            self._close_call(rest, out, closed=False)
        elif not self._after_call:
            out.content += rest
