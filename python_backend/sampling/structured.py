"""Structured output: ``response_format`` json_object / json_schema enforced while decoding.

Owns: ``GrammarCompiler`` (built once per model from its tokenizer; compiles a request's
``response_format`` into a grammar, cached by schema) and the per-sequence matcher that masks
every token the grammar does not allow, so the output always parses and matches the schema.
Uses ``xgrammar`` (a maintained constrained-decoding library with CPU kernels).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from python_backend.protocol.errors import invalid

_CACHE_SIZE = 64
_ANY_OBJECT = json.dumps({"type": "object"})


class GrammarCompiler:
    """Compiles response formats for one tokenizer; safe to call from the request thread."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> None:
        self._info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=1, cache_enabled=True)
        self._lock = threading.Lock()
        self.vocab_size = vocab_size

    def compile(self, response_format: dict[str, Any]) -> Any:
        """The compiled grammar for ``response_format`` (``json_object`` or ``json_schema``)."""
        kind = response_format.get("type")
        with self._lock:
            if kind == "json_object":
                # OpenAI's json_object means an object at the top level (clients parse it as a
                # dict), not any JSON value; inside it, any JSON, whitespace allowed as before.
                return self._compiler.compile_json_schema(_ANY_OBJECT, any_whitespace=True, strict_mode=False)
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise invalid("'response_format.json_schema.schema' must be a JSON schema object", "response_format")
            try:
                # Compact JSON (no free whitespace): models, small ones most, can otherwise loop on
                # whitespace the grammar allows and never close the object.
                return self._compiler.compile_json_schema(
                    json.dumps(spec["schema"]), any_whitespace=False, strict_mode=bool(spec.get("strict", True))
                )
            except (RuntimeError, ValueError) as exc:
                # xgrammar explains what it cannot handle; that text is about the user's schema.
                raise invalid(f"'response_format.json_schema.schema' is not usable: {exc}", "response_format") from exc


class GrammarState:
    """One sequence's position in its grammar."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits of tokens the grammar forbids next to -inf (in place, one row)."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        row = logits.unsqueeze(0)
        xgr.apply_token_bitmask_inplace(row, self._bitmask.to(logits.device))

    def accept(self, token_id: int) -> None:
        self._matcher.accept_token(token_id)

    @property
    def terminated(self) -> bool:
        return bool(self._matcher.is_terminated())
