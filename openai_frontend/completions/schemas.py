"""The HTTP request body of ``POST /v1/completions``.

Owns: ``CompletionRequest``: the shared generation fields (``chat.schemas.GenerationRequest``)
plus the completions-only ``prompt``, ``suffix``, ``echo`` and the integer ``logprobs``. Their
rules are in ``completions.validation``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, WithJsonSchema

from openai_frontend.chat.schemas import GenerationRequest, OptBoolean, OptInteger

_STRING: dict[str, Any] = {"type": "string"}
_TOKENS: dict[str, Any] = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
Prompt = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {**_STRING, "minLength": 1},
                {"type": "array", "items": {**_STRING, "minLength": 1}, "minItems": 1},
                _TOKENS,
                {"type": "array", "items": _TOKENS, "minItems": 1},
            ]
        }
    ),
]


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions`` body (OpenAI / vLLM field names)."""

    prompt: Prompt = Field(..., description="a string, a list of strings, or token ids (a list, or lists)")
    suffix: Any = Field(None, description="refused: text after the completion is not supported")
    echo: OptBoolean = Field(None, description="true: each choice's text starts with its prompt")
    logprobs: OptInteger = Field(
        None, description="[0, max_logprobs (20 by default)]: log-probabilities of this many top tokens"
    )
