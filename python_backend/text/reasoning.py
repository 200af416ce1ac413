"""Splitting ``<think>...</think>`` reasoning from the answer (Qwen3, DeepSeek-R1, QwQ style).

Owns: ``ReasoningSplitter`` (incremental, one per sequence) and its reasoning-token count. Where
reasoning can start is decided from the template's state by ``output_formats``, not by searching
the whole output for tags, so an answer is never filed as reasoning because of a stray tag:

* ``forced``: the rendered prompt already ends inside an open ``<think>`` (the template opened
  it), so the output starts as reasoning and turns into content at ``</think>``.
* not forced: reasoning only when the output itself *starts* with ``<think>`` (after optional
  whitespace); otherwise everything is content and no tag is looked for again.
* (no splitter at all when ``enable_thinking`` is false or the template closed the think block.)

If ``</think>`` never comes, the text stays reasoning: it was streamed as reasoning already, and
a stream cannot take back what it sent, so a non-streaming answer is made to agree with it.
Whitespace next to the tags is dropped (the templates add ``\\n`` there when they re-render the
history). Text is held back only while it could still be a tag (or trailing whitespace before a
possible ``</think>``).

Reasoning tokens are the tokens fed while reasoning, the two tags included.
"""

from __future__ import annotations

from dataclasses import dataclass

from python_backend.text.tool_parsers.base import held_prefix

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
_DETECT, _REASONING, _CONTENT = "detect", "reasoning", "content"


@dataclass
class SplitOutput:
    content: str = ""
    reasoning: str = ""


class ReasoningSplitter:
    """Incremental splitter of one sequence's text into reasoning and content."""

    def __init__(self, forced: bool) -> None:
        self._phase = _REASONING if forced else _DETECT
        self._buffer = ""
        self._strip_leading = forced
        self._entered = False  # reasoning started during the current feed
        self._tentative = 0  # tokens seen while it was not yet known whether reasoning starts
        self.reasoning_tokens = 0

    @property
    def in_reasoning(self) -> bool:
        return self._phase == _REASONING

    def feed(self, text: str, tokens: int = 1) -> SplitOutput:
        """Add the text of the next ``tokens`` generated tokens (the text may be empty)."""
        start, self._entered = self._phase, False
        out = SplitOutput()
        self._buffer += text
        while self._step(out):
            pass
        if start == _REASONING or self._entered:
            self.reasoning_tokens += self._tentative + tokens
            self._tentative = 0
        elif self._phase == _DETECT:
            self._tentative += tokens
        else:
            self._tentative = 0
        return out

    def _step(self, out: SplitOutput) -> bool:
        """Consume what the buffer allows; True when the phase changed and there may be more."""
        if self._strip_leading:
            self._buffer = self._buffer.lstrip()
            if not self._buffer:
                return False
            self._strip_leading = False
        if self._phase == _DETECT:
            head = self._buffer.lstrip()
            if head.startswith(OPEN_TAG):
                self._buffer = head[len(OPEN_TAG) :]
                self._phase, self._strip_leading, self._entered = _REASONING, True, True
                return True
            if OPEN_TAG.startswith(head):
                return False  # still possibly "<think>": hold
            self._phase = _CONTENT
            return True
        if self._phase == _REASONING:
            end = self._buffer.find(CLOSE_TAG)
            if end >= 0:
                out.reasoning += self._buffer[:end].rstrip()
                self._buffer = self._buffer[end + len(CLOSE_TAG) :]
                self._phase, self._strip_leading = _CONTENT, True
                return True
            keep = held_prefix(self._buffer, (CLOSE_TAG,))
            ready = self._buffer[: len(self._buffer) - keep].rstrip()
            out.reasoning += ready
            self._buffer = self._buffer[len(ready) :]
            return False
        out.content += self._buffer
        self._buffer = ""
        return False

    def finish(self) -> SplitOutput:
        """The sequence ended: release what is held (see the module docstring for an open block)."""
        rest, self._buffer = self._buffer, ""
        if self._phase == _REASONING:
            return SplitOutput(reasoning=rest.rstrip())
        if self._strip_leading:
            rest = rest.lstrip()
        return SplitOutput(content=rest)
