"""Server-Sent Events for streaming chat completions: framing and chunk building.

Owns: ``ChoiceStreamFormatter`` (what every endpoint's stream shares: per-choice accumulation,
the usage chunk, the error ending, ``data: [DONE]``) and ``StreamFormatter``, chat's chunks over
it, which turns backend deltas into ``data: {json}\\n\\n`` events and ends every stream with
``data: [DONE]``, and ``keepalive_until``, the ``: keep-alive`` comment lines a stream sends while
it waits for its first event (SSE clients skip comment lines; proxies see traffic). No I/O here
(``serving`` drives both), so the exact bytes are unit-testable. Formats (docs/api.md, streaming):

* MindIE mode: one choice per chunk, ``delta = {"role": "assistant", "content": piece}``;
  a ``logprobs`` key only when n > 1 or logprobs were requested (format 2 vs 3); the last chunk
  of each choice carries its ``finish_reason`` and that choice's ``usage``; with
  ``fullTextEnabled`` the content is cumulative and the last chunk adds ``full_text``. An error
  after the stream started ends each unfinished choice with ``finish_reason: "stop"`` and a
  top-level ``err_msg``.
* OpenAI mode: a role-only first chunk per choice, later deltas without ``role``, usage only with
  ``stream_options.include_usage`` in a last chunk with ``choices: []`` (and, with
  ``continuous_usage_stats`` too, on every chunk: the prompt and that choice's tokens so far, as
  vLLM does); an error is a ``data: {"error": {...}}`` event (what OpenAI clients parse).
"""

from __future__ import annotations

import asyncio
import json
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from openai_frontend.chat.accumulate import ChoiceAccumulator, logprobs_json
from openai_frontend.chat.responses import choice_usage, total_usage
from python_backend.protocol.contract import ChoiceDelta, said
from python_backend.protocol.errors import ErrorInfo, backend_incomplete

OBJECT_CHUNK = "chat.completion.chunk"
# The ChoiceDelta fields a chunk's ``delta`` carries, under its keys.
_CHUNK_KEYS = {"text": "content", "reasoning": "reasoning_content", "tool_calls": "tool_calls"}
DONE_EVENT = b"data: [DONE]\n\n"
KEEPALIVE_EVENT = b": keep-alive\n\n"


# Compact JSON, as in MindIE's examples. One configured encoder (it holds no state between
# calls): json.dumps with these options builds a new encoder for every streamed token.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


# Python's str.splitlines, and so httpx's iter_lines that many SSE clients read with, also ends a
# line at these characters, which SSE does not and JSON leaves raw inside strings without
# ensure_ascii: a model that writes one would cut such a client's event in two. Escaped, they are
# the same JSON. (Those below U+0020 are escaped by the encoder already.)
_SPLITLINES_ENDS = re.compile("[\x85\u2028\u2029]")


def _escape_line_end(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


def json_bytes(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON that every line splitter keeps on one line."""
    text = _JSON.encode(value)
    if _SPLITLINES_ENDS.search(text):
        text = _SPLITLINES_ENDS.sub(_escape_line_end, text)
    return text.encode("utf-8")


def sse_event(payload: dict[str, Any]) -> bytes:
    """One SSE event."""
    return b"data: " + json_bytes(payload) + b"\n\n"


def _chunk_delta(delta: ChoiceDelta) -> dict[str, Any]:
    """A chunk's ``delta`` object: the text, reasoning and tool calls that say something (the rule
    of every wire form, ``said``)."""
    return {_CHUNK_KEYS[name]: value for name, value in said(delta).items() if name in _CHUNK_KEYS}


def _has_chunk(delta: ChoiceDelta) -> bool:
    """Whether ``delta`` makes a chunk: something to show, logprobs, or the choice's end."""
    return bool(delta.text or delta.reasoning or delta.tool_calls or delta.logprobs or delta.finish_reason is not None)


async def keepalive_until(waited: asyncio.Future[Any], interval_s: float) -> AsyncGenerator[bytes, None]:
    """A ``: keep-alive`` comment every ``interval_s`` until ``waited`` is done (none if it is
    done within the first interval); it neither cancels nor reads ``waited``."""
    while not waited.done():
        done, _ = await asyncio.wait({waited}, timeout=interval_s)
        if not done:
            yield KEEPALIVE_EVENT


@dataclass(frozen=True)
class StreamOptions:
    """What shapes one stream's chunks."""

    request_id: str
    created: int
    model: str
    n: int  # choices the backend will stream (indices 0..n-1)
    logprobs: bool  # logprobs requested
    mindie: bool
    full_text: bool  # MindIE fullTextEnabled (ignored in OpenAI mode)
    include_usage: bool  # OpenAI stream_options.include_usage
    object: str = OBJECT_CHUNK  # every chunk's ``object`` field
    continuous_usage: bool = False  # OpenAI stream_options.continuous_usage_stats: usage on every chunk


class ChoiceStreamFormatter(ABC):
    """The SSE events of one streaming response, delta by delta; subclasses shape the chunks
    (``_mindie_delta``, ``_openai_delta``, and ``_error_entry`` for a MindIE error ending)."""

    def __init__(self, options: StreamOptions) -> None:
        self._o = options
        self._choices: dict[int, ChoiceAccumulator] = {}
        self._closed = False
        self.error: ErrorInfo | None = None  # what ended the stream, when an error did
        # Every chunk opens with the same four fields: serialized once per stream (without the
        # closing brace), so a token's event only serializes its ``choices``.
        head = json_bytes(self._head())
        self._choices_prefix = b"data: " + head[:-1] + b',"choices":'

    def _choice(self, index: int) -> ChoiceAccumulator:
        if index not in self._choices:
            self._choices[index] = ChoiceAccumulator(index)
        return self._choices[index]

    def _choices_event(self, entry: dict[str, Any]) -> bytes:
        """``sse_event({**self._head(), "choices": [entry]})``, without re-serializing the head."""
        return self._choices_prefix + json_bytes([entry]) + b"}\n\n"

    def _running_usage(self, choice: ChoiceAccumulator, completion_tokens: int) -> dict[str, int] | None:
        if not self._o.continuous_usage:
            return None
        prompt = choice.prompt_tokens_seen
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
        }

    def _entry_event(self, entry: dict[str, Any], usage: dict[str, int] | None) -> bytes:
        """One choice's chunk, with the running usage when continuous usage was asked for."""
        if usage is None:
            return self._choices_event(entry)
        return sse_event({**self._head(), "choices": [entry], "usage": usage})

    def _head(self) -> dict[str, Any]:
        return {"id": self._o.request_id, "object": self._o.object, "created": self._o.created, "model": self._o.model}

    def on_delta(self, delta: ChoiceDelta) -> list[bytes]:
        """Events for one backend delta (none for an empty, non-final one)."""
        choice = self._choice(delta.index)
        choice.add(delta)
        if self._o.mindie:
            return self._mindie_delta(delta, choice)
        return self._openai_delta(delta, choice)

    @abstractmethod
    def _mindie_delta(self, delta: ChoiceDelta, choice: ChoiceAccumulator) -> list[bytes]:
        """A MindIE-mode delta's events."""

    @abstractmethod
    def _openai_delta(self, delta: ChoiceDelta, choice: ChoiceAccumulator) -> list[bytes]:
        """An OpenAI-mode delta's events."""

    @abstractmethod
    def _error_entry(self, index: int, choice: ChoiceAccumulator) -> dict[str, Any]:
        """The ``choices`` entry that ends an unfinished choice after an error (MindIE mode)."""

    def _final_chunk(self, entry: dict[str, Any], choice: ChoiceAccumulator) -> bytes:
        """A choice's last MindIE chunk: its usage (and ``full_text``) beside the entry."""
        chunk = self._head()
        if self._o.full_text:
            chunk["full_text"] = choice.text
        chunk["usage"] = choice_usage(choice.final_usage())
        chunk["choices"] = [entry]
        return sse_event(chunk)

    def _unfinished(self) -> list[int]:
        indices = set(range(self._o.n)) | set(self._choices)
        return sorted(i for i in indices if not self._choice(i).finished)

    def on_end(self) -> list[bytes]:
        """Events after the backend's last delta: usage (OpenAI), then ``[DONE]``."""
        if self._unfinished():
            return self.on_error(backend_incomplete())
        if self._closed:
            return []
        self._closed = True
        events = []
        if not self._o.mindie and self._o.include_usage:
            events.append(sse_event({**self._head(), "choices": [], "usage": self._usage()}))
        events.append(DONE_EVENT)
        return events

    def _usage(self) -> dict[str, Any]:
        """The OpenAI usage chunk's ``usage``."""
        return total_usage([self._choices[i].final_usage() for i in sorted(self._choices)], mindie=False)

    def on_error(self, info: ErrorInfo) -> list[bytes]:
        """Events that end a started stream with an error event, then ``[DONE]``."""
        if self._closed:
            return []
        self._closed = True
        self.error = info
        if not self._o.mindie:
            error = {"message": info.message, "type": info.type, "param": info.param, "code": info.code}
            return [sse_event({"error": error}), DONE_EVENT]
        events = []
        for index in self._unfinished():
            choice = self._choice(index)
            choice.finish_reason = "stop"
            entry = self._error_entry(index, choice)
            events.append(sse_event({**self._head(), "err_msg": info.message or "error", "choices": [entry]}))
        events.append(DONE_EVENT)
        return events


class StreamFormatter(ChoiceStreamFormatter):
    """Chat's chunks: ``chat.completion.chunk`` with a ``delta`` message per choice."""

    def __init__(self, options: StreamOptions) -> None:
        super().__init__(options)
        self._role_sent: set[int] = set()

    @property
    def _logprobs_key(self) -> bool:
        return self._o.n > 1 or self._o.logprobs

    def _logprobs_value(self, delta: ChoiceDelta) -> dict[str, Any] | None:
        return logprobs_json(delta.logprobs or []) if self._o.logprobs else None

    def _mindie_delta(self, delta: ChoiceDelta, choice: ChoiceAccumulator) -> list[bytes]:
        if not _has_chunk(delta):
            return []
        final = delta.finish_reason is not None
        body: dict[str, Any] = {"role": "assistant", "content": "", **_chunk_delta(delta)}
        body["content"] = choice.text if self._o.full_text else delta.text  # in every MindIE chunk
        entry: dict[str, Any] = {"index": delta.index, "delta": body}
        if self._logprobs_key:
            entry["logprobs"] = self._logprobs_value(delta)
        entry["finish_reason"] = delta.finish_reason
        if not final:
            return [self._choices_event(entry)]
        return [self._final_chunk(entry, choice)]

    def _openai_chunk(
        self, index: int, body: dict[str, Any], logprobs: Any, finish: str | None, usage: dict[str, int] | None
    ) -> bytes:
        entry = {"index": index, "delta": body, "logprobs": logprobs, "finish_reason": finish}
        return self._entry_event(entry, usage)

    def _openai_delta(self, delta: ChoiceDelta, choice: ChoiceAccumulator) -> list[bytes]:
        events = []
        if delta.index not in self._role_sent:
            self._role_sent.add(delta.index)
            role = {"role": "assistant", "content": ""}
            events.append(self._openai_chunk(delta.index, role, None, None, self._running_usage(choice, 0)))
        if not _has_chunk(delta):
            return events
        body = _chunk_delta(delta)
        usage = self._running_usage(choice, choice.output_tokens_seen)
        events.append(self._openai_chunk(delta.index, body, self._logprobs_value(delta), delta.finish_reason, usage))
        return events

    def _error_entry(self, index: int, choice: ChoiceAccumulator) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "index": index,
            "delta": {"role": "assistant", "content": choice.text if self._o.full_text else ""},
        }
        if self._logprobs_key:
            entry["logprobs"] = None
        entry["finish_reason"] = "stop"
        return entry
