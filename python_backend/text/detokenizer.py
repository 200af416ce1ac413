"""Incremental, UTF-8-safe detokenization of one sequence.

Owns: ``IncrementalDetokenizer``. Each new token is decoded against a short window of earlier
tokens (so SentencePiece leading spaces and multi-token characters come out right), and text is
held back while it ends in U+FFFD, i.e. while a multi-byte character is still incomplete.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

_CONTEXT_TOKENS = 5  # earlier tokens decoded with each new one; enough for any merge context
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # Seed with the prompt's tail so the first output token decodes in context.
        self._ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False))

    def add(self, token_id: int) -> str:
        """Add one token; return the text that is now certain (may be empty)."""
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """At the end of the sequence: whatever is held, even an incomplete character."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if len(full_text) <= len(prefix_text) or (full_text.endswith(_REPLACEMENT) and not final):
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix = self._read
        self._read = len(self._ids)
        # Keep the window short: drop ids nobody will decode again.
        if self._prefix > 64:
            self._ids = self._ids[self._prefix :]
            self._read -= self._prefix
            self._prefix = 0
        return delta
