"""Server-Sent Events for streaming completions.

Owns: ``CompletionStreamFormatter``, completions' chunks over chat's per-choice stream
(``chat.sse.ChoiceStreamFormatter``: usage chunk, error ending and ``[DONE]`` are shared). A chunk
is ``{"id", "object": "text_completion", "created", "model", "choices": [{"index", "text",
"logprobs", "finish_reason"}]}``; with ``echo`` a choice's first chunk starts with its prompt. MindIE
mode adds, as in chat, the choice's ``usage`` to its last chunk (and ``full_text`` with
``fullTextEnabled``, whose ``text`` is then cumulative). With ``echo`` and ``logprobs`` the first
chunk's logprobs start with the prompt's tokens (the first delta of each prompt's request brings
them); ``echo`` with ``max_tokens`` 0 streams the prompt alone (its deltas come without the
generated token: ``serving.prompt_only``).
"""

from __future__ import annotations

from typing import Any

from openai_frontend.chat.accumulate import ChoiceAccumulator
from openai_frontend.chat.sse import ChoiceStreamFormatter, StreamOptions
from openai_frontend.completions.responses import LogprobsCursor, completions_usage
from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.prompt_logprobs import PromptLogprobs


class CompletionStreamFormatter(ChoiceStreamFormatter):
    """Builds the SSE events of one streaming completion, delta by delta."""

    def __init__(self, options: StreamOptions, prompts: tuple[str, ...], per_prompt: int, echo: bool) -> None:
        super().__init__(options)
        self._prompts = prompts
        self._per_prompt = per_prompt
        self._echo = echo
        self._started: set[int] = set()  # choices whose first chunk went out (echo rides on it)
        self._cursors: dict[int, LogprobsCursor] = {}
        self._scored: dict[int, PromptLogprobs] = {}  # per prompt, once its request sent them

    def _prompt_of(self, index: int) -> str:
        return self._prompts[index // self._per_prompt] if self._echo else ""

    def _entry(self, delta: ChoiceDelta, text: str, first: bool) -> dict[str, Any]:
        logprobs = None
        if self._o.logprobs:
            prompt = self._scored.get(delta.index // self._per_prompt) if first and self._echo else None
            start = 0 if prompt is not None else len(self._prompt_of(delta.index))
            cursor = self._cursors.setdefault(delta.index, LogprobsCursor(start))
            logprobs = cursor.block(delta.logprobs or [], prompt)
        return {"index": delta.index, "text": text, "logprobs": logprobs, "finish_reason": delta.finish_reason}

    def _piece(self, delta: ChoiceDelta) -> tuple[str, bool]:
        """The text of this delta's chunk, with the echo on a choice's first; and whether it is the first."""
        if delta.prompt_logprobs is not None:
            self._scored[delta.index // self._per_prompt] = delta.prompt_logprobs
        first = delta.index not in self._started
        self._started.add(delta.index)
        return (self._prompt_of(delta.index) if first else "") + delta.text, first

    def _openai_delta(self, delta: ChoiceDelta, choice: ChoiceAccumulator) -> list[bytes]:
        piece, first = self._piece(delta)
        if not (piece or delta.logprobs or delta.finish_reason is not None):
            return []
        usage = self._running_usage(choice, choice.output_tokens_seen)
        return [self._entry_event(self._entry(delta, piece, first), usage)]

    def _mindie_delta(self, delta: ChoiceDelta, choice: ChoiceAccumulator) -> list[bytes]:
        piece, first = self._piece(delta)
        if not (piece or delta.logprobs or delta.finish_reason is not None):
            return []
        text = self._prompt_of(delta.index) + choice.text if self._o.full_text else piece
        entry = self._entry(delta, text, first)
        if delta.finish_reason is None:
            return [self._choices_event(entry)]
        return [self._final_chunk(entry, choice)]

    def _error_entry(self, index: int, choice: ChoiceAccumulator) -> dict[str, Any]:
        text = self._prompt_of(index) + choice.text if self._o.full_text else ""
        return {"index": index, "text": text, "logprobs": None, "finish_reason": "stop"}

    def _usage(self) -> dict[str, Any]:
        by_index = {i: choice.final_usage() for i, choice in self._choices.items()}
        usage: dict[str, Any] = completions_usage(by_index, self._per_prompt, mindie=False)["usage"]
        return usage
