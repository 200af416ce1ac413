"""Turning one request's contract inputs into the ``EngineRequest`` the engine takes.

Owns ``Intake`` (what a loaded model needs to read a request: tokenizer, LoRA adapters, tool-call
and reasoning formats, the media processor and the grammar compiler), ``Connection`` (the
transport's part of a request: where its events go and how its cancellation is asked) and
``chat_inputs`` (a chat request as contract tensors, for callers without a transport).

The steps, in order: ``prepare`` (parameters, messages, the chat template or the raw prompt or
the prompt's token ids, media, the output plan: ``prompt/inputs.py``), the grammar of a
``response_format`` (``sampling/structured.py``; ``RequestPreparer`` waits for it off the
caller's thread, ``grammar_now`` on it), then ``request``. ``from_inputs`` runs them all at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from python_backend.engine.request import EngineEvent, EngineRequest
from python_backend.model.loader import LoadedModel
from python_backend.prompt.inputs import PreparedRequest, decode_request
from python_backend.prompt.multimodal.processor import MediaProcessor
from python_backend.protocol import contract
from python_backend.protocol.params import MAX_TOP_LOGPROBS, GenerationParams
from python_backend.protocol.settings import EngineSettings
from python_backend.sampling.structured import GrammarCompiler
from python_backend.text.output_formats import ModelFormats, resolve_formats


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Connection:
    """What only the transport knows of a request: where its events go, whether it was cancelled."""

    sink: Callable[[EngineEvent], None]
    is_cancelled: Callable[[], bool] = _never


@dataclass
class Intake:
    tokenizer: PreTrainedTokenizerBase
    grammars: GrammarCompiler
    adapters: frozenset[str] = frozenset()
    formats: ModelFormats | None = None  # None: plain text (no tool-call or reasoning parsing)
    media: MediaProcessor | None = None  # None: media parts are refused
    max_logprobs: int = MAX_TOP_LOGPROBS  # the ceiling of top_logprobs and prompt_logprobs

    @classmethod
    def for_model(cls, loaded: LoadedModel, settings: EngineSettings) -> Intake:
        """The intake of a loaded model, with the output formats and schema limit ``settings`` name."""
        formats = resolve_formats(
            settings.tool_call_parser, settings.reasoning_parser, loaded.tokenizer, loaded.model_type
        )
        grammars = GrammarCompiler(loaded.tokenizer, loaded.vocab_size, settings.max_response_format_bytes)
        return cls(loaded.tokenizer, grammars, loaded.adapters, formats, loaded.media, settings.max_logprobs)

    def prepare(self, get: Callable[[str], np.ndarray | None], request_parameters: str = "") -> PreparedRequest:
        """Validate and tokenize one request's inputs (read by name); ``ContractError`` names a bad one.
        ``request_parameters`` is the transport's request parameters as JSON (the vLLM contract)."""
        return decode_request(
            get,
            self.tokenizer,
            self.adapters,
            self.formats,
            self.media,
            request_parameters=request_parameters,
            max_logprobs=self.max_logprobs,
        )

    def grammar_now(self, params: GenerationParams) -> Any:
        """The compiled grammar of a ``response_format`` (None without one), waiting for it here."""
        return self.grammars.compile(params.response_format) if params.response_format is not None else None

    def request(
        self, request_id: str, prepared: PreparedRequest, grammar: Any, connection: Connection
    ) -> EngineRequest:
        """The engine's request: the prepared inputs, their grammar and the transport's connection."""
        return EngineRequest(
            request_id=request_id,
            prompt_ids=prepared.prompt_ids,
            params=prepared.params,
            sink=connection.sink,
            is_cancelled=connection.is_cancelled,
            stream=prepared.stream,
            output=prepared.output,
            grammar=grammar,
            media=prepared.media,
        )

    def from_inputs(
        self, request_id: str, inputs: Mapping[str, np.ndarray], connection: Connection, request_parameters: str = ""
    ) -> EngineRequest:
        """Every step on the caller's thread (no deadlines): for callers without a transport."""
        prepared = self.prepare(inputs.get, request_parameters)
        return self.request(request_id, prepared, self.grammar_now(prepared.params), connection)

    def close(self) -> None:
        self.grammars.close()


def chat_inputs(
    messages: list[dict[str, Any]], parameters: dict[str, Any], stream: bool = True
) -> dict[str, np.ndarray]:
    """A chat request's contract tensors, as a client would send them."""
    return {
        contract.MESSAGES: contract.json_tensor(messages),
        contract.PARAMETERS: contract.json_tensor(parameters),
        contract.STREAM: contract.bool_tensor(stream),
    }
