"""Structured output: ``response_format`` json_object / json_schema enforced while decoding.

Owns: ``GrammarCompiler`` (built once per model from its tokenizer; checks a request's
``response_format`` against the size ceiling, compiles it on its own thread and keeps the
compiled grammars in a bounded cache keyed by schema), ``GrammarSpec`` (that key) and the
per-sequence matcher that masks every token the grammar does not allow, so the output always
parses and matches the schema. Uses ``xgrammar`` (a maintained constrained-decoding library with
CPU kernels); its compile releases the GIL, so compiling beside the engine does not stall it.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from python_backend.protocol.errors import ContractError, invalid

logger = logging.getLogger(__name__)

CACHE_ENTRIES = 64  # compiled grammars kept (least recently used go first)
DEFAULT_MAX_SCHEMA_BYTES = 65536
JSON_OBJECT = "json_object"
FIELD = "response_format"
_ANY_OBJECT = json.dumps({"type": "object"})


@dataclass(frozen=True)
class GrammarSpec:
    """A validated ``response_format``: what to compile, and the key of its cache entry."""

    kind: str  # "json_object" or "json_schema"
    schema: str = ""  # the schema as compact JSON, in the order given (property order matters)
    strict: bool = True


class GrammarCompiler:
    """Compiles response formats for one tokenizer, one at a time on its own thread.

    ``spec`` and ``cached`` are cheap and may be called from any thread; ``compile_async``
    returns at once. A schema larger than ``max_schema_bytes`` is refused before any work:
    xgrammar's compile time grows faster than linearly with it (a 50,000-string enum takes
    minutes on a small machine), and a compile cannot be interrupted once started.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES,
        cache_entries: int = CACHE_ENTRIES,
    ) -> None:
        self._info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        # xgrammar's own cache is unbounded by default: this class keeps a bounded one instead.
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=1, cache_enabled=False)
        self.vocab_size = vocab_size
        self.max_schema_bytes = max_schema_bytes
        self._cache_entries = cache_entries
        self._lock = threading.Lock()
        self._cache: OrderedDict[GrammarSpec, Any] = OrderedDict()  # guarded by _lock
        self._in_flight: dict[GrammarSpec, Future[Any]] = {}  # guarded by _lock
        self._jobs: queue.SimpleQueue[GrammarSpec | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def spec(self, response_format: dict[str, Any]) -> GrammarSpec:
        """Check ``response_format``'s shape and size; raise a 400 naming ``response_format``."""
        if response_format.get("type") == JSON_OBJECT:
            return GrammarSpec(JSON_OBJECT)
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise invalid("'response_format.json_schema.schema' must be a JSON schema object", FIELD)
        schema = json.dumps(spec["schema"], separators=(",", ":"))  # ASCII: \u escapes for the rest
        size = len(schema)
        if size > self.max_schema_bytes:
            raise invalid(
                f"'response_format.json_schema.schema' is {size} bytes as JSON; the limit is "
                f"{self.max_schema_bytes} (max_response_format_bytes)",
                FIELD,
            )
        return GrammarSpec("json_schema", schema, bool(spec.get("strict", True)))

    def cached(self, spec: GrammarSpec) -> Any | None:
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                self._cache.move_to_end(spec)
            return compiled

    def compile_async(self, spec: GrammarSpec) -> Future[Any]:
        """The compiled grammar, as a future; requests with the same spec share one compile.
        Its exception is a ``ContractError`` when the schema is not usable."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="triton-chat-grammar", daemon=True)
                self._thread.start()
            future = self._in_flight.get(spec)
            if future is not None:
                return future
            future = Future()
            compiled = self._cache.get(spec)
            if compiled is not None:
                future.set_result(compiled)
                return future
            self._in_flight[spec] = future
        self._jobs.put(spec)
        return future

    def compile(self, response_format: dict[str, Any]) -> Any:
        """The compiled grammar for ``response_format``, waiting for it (callers off the step loop)."""
        return self.compile_async(self.spec(response_format)).result()

    def close(self) -> None:
        """Stop the compile thread after the compile it is in (it cannot be interrupted)."""
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            spec = self._jobs.get()
            if spec is None:
                return
            try:
                compiled: Any = self._compile(spec)
                error: BaseException | None = None
            except ContractError as exc:
                compiled, error = None, exc
            except Exception as exc:  # a bug in xgrammar: this request fails, the thread goes on
                logger.exception("compiling a response_format failed")
                compiled, error = None, exc
            with self._lock:
                future = self._in_flight.pop(spec)
                if compiled is not None:
                    self._cache[spec] = compiled
                    while len(self._cache) > self._cache_entries:
                        self._cache.popitem(last=False)
            if error is None:
                future.set_result(compiled)
            else:
                future.set_exception(error)

    def _compile(self, spec: GrammarSpec) -> Any:
        if spec.kind == JSON_OBJECT:
            # OpenAI's json_object means an object at the top level (clients parse it as a dict),
            # not any JSON value; inside it, any JSON, whitespace allowed as before.
            return self._compiler.compile_json_schema(_ANY_OBJECT, any_whitespace=True, strict_mode=False)
        try:
            # Compact JSON (no free whitespace): models, small ones most, can otherwise loop on
            # whitespace the grammar allows and never close the object.
            return self._compiler.compile_json_schema(spec.schema, any_whitespace=False, strict_mode=spec.strict)
        except (RuntimeError, ValueError) as exc:
            # xgrammar explains what it cannot handle; that text is about the user's schema.
            raise invalid(f"'response_format.json_schema.schema' is not usable: {exc}", FIELD) from exc


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
