"""The text and raw bytes of single tokens, for ``logprobs``.

Owns: ``TokenTexts``. OpenAI's ``bytes`` field must be the token's own UTF-8 bytes even when the
token is only part of a character (byte-level BPE pieces, SentencePiece ``<0xNN>`` byte-fallback
tokens), so bytes come from the vocabulary entry, not from decoding to text and re-encoding.
"""

from __future__ import annotations

import re
from functools import lru_cache

from transformers import PreTrainedTokenizerBase

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-character <-> byte table used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenTexts:
    """Cached ``id -> (text, bytes)`` for one tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        pieces = tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), 512))))
        # A byte-level vocabulary spells a space as "Ġ"; SentencePiece spells it "▁".
        self._byte_level = any(isinstance(p, str) and "Ġ" in p for p in pieces)

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._compute(token_id)
            self._cache[token_id] = hit
        return hit

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        text = str(self._tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):
            return text, list(text.encode("utf-8"))
        fallback = _BYTE_FALLBACK.match(piece)
        if fallback:
            return text, [int(fallback.group(1), 16)]
        if self._byte_level:
            table = _byte_level_decoder()
            if all(ch in table for ch in piece):
                return text, [table[ch] for ch in piece]
        return text, list(piece.replace("▁", " ").encode("utf-8"))
