"""The HTTP request body of ``POST /v1/chat/completions``, and the fields it shares with completions.

Owns: ``GenerationRequest`` (the body fields of every generation endpoint: model, stream,
sampling), ``ChatCompletionRequest`` (pydantic v2) and the allow-lists of their generation fields
(``to_backend_parameters``, the input of ``parse_parameters``; the tensor carries the parsed form). Generation fields are typed ``Any`` on purpose: their ranges,
types and cross-field rules live in ``python_backend.protocol.params.parse_parameters``, which both this
frontend and the Triton model run, so an HTTP caller and a tritonclient caller get identical
errors. The JSON schema still documents each field's type and range, taken from the same
constants (for generated clients and API fuzzers). Also owns ``UNSUPPORTED_FIELDS``: the known
OpenAI and vLLM fields this server refuses rather than ignores.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, WithJsonSchema

from python_backend.protocol.messages import MEDIA_PART_TYPES
from python_backend.protocol.param_fields import INT32_MAX, MAX_N, MAX_TOP_LOGPROBS, UINT64_MAX


def _nullable(*types: dict[str, Any]) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [*types, {"type": "null"}]})


_BOOLEAN: dict[str, Any] = {"type": "boolean"}
_OBJECT: dict[str, Any] = {"type": "object"}
_OBJECTS: dict[str, Any] = {"type": "array", "items": _OBJECT}


def _number(**bounds: float) -> WithJsonSchema:
    return _nullable({"type": "number", **bounds})


def _integer(low: int, high: int) -> WithJsonSchema:
    return _nullable({"type": "integer", "minimum": low, "maximum": high})


# Validated as ``Any`` (the rules are parse_parameters'), documented with the type and range
# clients may send.
OptNumber = Annotated[Any, _nullable({"type": "number"})]
OptInteger = Annotated[Any, _nullable({"type": "integer"})]
OptIntegers = Annotated[Any, _nullable({"type": "array", "items": {"type": "integer"}})]
OptBoolean = Annotated[Any, _nullable(_BOOLEAN)]
OptObject = Annotated[Any, _nullable(_OBJECT)]
OptObjects = Annotated[Any, _nullable(_OBJECTS)]
OptTokenIds = Annotated[
    Any, _nullable({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": INT32_MAX}})
]
_STOP_TEXT: dict[str, Any] = {"type": "string", "minLength": 1}
OptStop = Annotated[Any, _nullable(_STOP_TEXT, {"type": "array", "items": _STOP_TEXT})]
OptToolChoice = Annotated[Any, _nullable({"type": "string", "enum": ["none", "auto", "required"]}, _OBJECT)]
OptStreamOptions = Annotated[
    Any,
    _nullable({"type": "object", "properties": {"include_usage": _BOOLEAN, "continuous_usage_stats": _BOOLEAN}}),
]
OptLogitBias = Annotated[
    Any, _nullable({"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}})
]
MinP = Annotated[Any, _number(minimum=0, maximum=1)]
Temperature = Annotated[Any, _number(minimum=0)]
TopP = Annotated[Any, _number(exclusiveMinimum=1e-6, maximum=1)]
RepetitionPenalty = Annotated[Any, _number(exclusiveMinimum=0, maximum=2)]
Penalty = Annotated[Any, _number(minimum=-2, maximum=2)]
TopK = Annotated[Any, _integer(-1, INT32_MAX)]
Seed = Annotated[Any, _integer(0, UINT64_MAX)]
MaxTokens = Annotated[Any, _integer(1, INT32_MAX)]
MinTokens = Annotated[Any, _integer(0, INT32_MAX)]
Choices = Annotated[Any, _integer(1, MAX_N)]
TopLogprobs = Annotated[Any, _integer(0, MAX_TOP_LOGPROBS)]
_TEXT: dict[str, Any] = {"type": "string", "minLength": 1}
_PARTS: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "items": {
        "anyOf": [
            {"type": "object", "properties": {"type": {"const": "text"}, "text": _TEXT}, "required": ["type", "text"]},
            *(
                {"type": "object", "properties": {"type": {"const": kind}, kind: {}}, "required": ["type", kind]}
                for kind in MEDIA_PART_TYPES
            ),
        ]
    },
}
# What python_backend.protocol.messages checks, as far as a schema says it: a role, and content as
# text or parts (an assistant's message with tool_calls may also leave content out).
_MESSAGE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "role": _TEXT,
        "content": {"anyOf": [_TEXT, _PARTS]},
        "name": {"type": "string"},
        "tool_calls": _OBJECTS,
        "tool_call_id": _TEXT,
    },
    "required": ["role", "content"],
}
Messages = Annotated[Any, WithJsonSchema({"type": "array", "items": _MESSAGE, "minItems": 1})]

# The request fields that ``parse_parameters`` reads, on every generation endpoint. ``lora`` is
# not among them: it comes from ``model``, never from the body.
SAMPLING_FIELDS: tuple[str, ...] = (
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "ignore_eos",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "n",
    "best_of",
    "use_beam_search",
    "logit_bias",
    "min_p",
    "prompt_logprobs",
)
# Chat's own: ``logprobs`` is a boolean here (completions: an integer, mapped by that endpoint).
GENERATION_FIELDS: tuple[str, ...] = (
    *SAMPLING_FIELDS,
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "response_format",
    "add_generation_prompt",
    "continue_final_message",
)

# Known OpenAI and vLLM request fields this server does not implement, each with the value that
# asks for nothing (None: only null or absent). Any other value is a 400 naming the field rather
# than an answer that silently ignores it; truly unknown fields go to ``x-ignored-params``.
UNSUPPORTED_FIELDS: Mapping[str, object] = MappingProxyType(
    {
        "audio": None,
        "modalities": ("text",),
        "prediction": None,
        "functions": None,
        "function_call": None,
        "web_search_options": None,
        "reasoning_effort": None,
        "verbosity": None,
        "priority": 0,
        "guided_json": None,
        "guided_regex": None,
        "guided_choice": None,
        "guided_grammar": None,
        "guided_decoding_backend": None,
        "guided_whitespace_pattern": None,
        "structured_outputs": None,
        "length_penalty": 1.0,
        "early_stopping": False,
        "spaces_between_special_tokens": True,
        "truncate_prompt_tokens": None,
        "bad_words": None,
        "allowed_token_ids": None,
        "logits_processors": None,
        "return_tokens_as_token_ids": False,
        "return_token_ids": False,
        "add_special_tokens": False,
        "documents": None,
        "chat_template": None,
        "mm_processor_kwargs": None,
        "vllm_xargs": None,
        "kv_transfer_params": None,
        "cache_salt": None,
    }
)


class GenerationRequest(BaseModel):
    """The body fields every generation endpoint shares (MindIE / vLLM / OpenAI field names).

    Unknown fields are kept (``extra="allow"``) so the route can name them in the
    ``x-ignored-params`` header, or reject them when the server runs with strict params.
    """

    model_config = ConfigDict(extra="allow")
    generation_fields: ClassVar[tuple[str, ...]] = SAMPLING_FIELDS

    model: StrictStr = Field(..., description="served model name, or a LoRA adapter name")
    stream: StrictBool | None = Field(None, description="true: Server-Sent Events (beam search: one JSON body)")
    stream_options: OptStreamOptions = Field(
        None,
        description="OpenAI mode only: include_usage adds a final usage chunk; with it, continuous_usage_stats "
        "adds usage to every chunk",
    )

    temperature: Temperature = Field(None, description=">= 0; must be > 0 when n or best_of > 1")
    top_p: TopP = Field(None, description="(1e-6, 1]")
    top_k: TopK = Field(None, description="-1 or 0 = off, else [1, 2^31-1]; clamped to the vocabulary")
    repetition_penalty: RepetitionPenalty = Field(None, description="(0, 2]")
    presence_penalty: Penalty = Field(None, description="[-2, 2]")
    frequency_penalty: Penalty = Field(None, description="[-2, 2]")
    seed: Seed = Field(None, description="[0, 2^64-1]")
    stop: OptStop = Field(None, description="stop strings, 32768 characters in total at most")
    stop_token_ids: OptTokenIds = Field(
        None, description="token ids that end a choice, [0, 2^31-1] and within the vocabulary"
    )
    include_stop_str_in_output: OptBoolean = Field(None, description="keep the matched stop text")
    skip_special_tokens: OptBoolean = Field(None, description="drop special tokens from the text")
    ignore_eos: OptBoolean = Field(None, description="keep generating past EOS")
    max_tokens: MaxTokens = Field(None, description="[1, 2^31-1]; capped by the server's maxIterTimes")
    max_completion_tokens: MaxTokens = Field(None, description="OpenAI alias of max_tokens")
    min_tokens: MinTokens = Field(None, description="EOS and stop tokens suppressed until this many tokens")
    n: Choices = Field(None, description="choices returned, [1, 128]")
    best_of: Choices = Field(None, description="candidates generated, [1, 128]; streaming: equal to n")
    use_beam_search: OptBoolean = Field(None, description="beam search; streaming answers one JSON body")
    logit_bias: OptLogitBias = Field(None, description="token id (as a string) -> bias in [-100, 100]")
    min_p: MinP = Field(None, description="[0, 1]; drop tokens below min_p x the top token's probability")
    prompt_logprobs: TopLogprobs = Field(
        None,
        description="[0, max_logprobs (20 by default)]: log-probabilities of the prompt's tokens and this many top tokens (not streamed)",
    )

    user: Any = Field(None, description="accepted and ignored")

    def unknown_fields(self) -> list[str]:
        """Body fields this server does not know, sorted (for the header or a strict-mode 400)."""
        return sorted(name for name in self.model_extra or {} if name not in UNSUPPORTED_FIELDS)

    def unsupported_field(self) -> str | None:
        """The first known field given with a value this server would not honour, if any."""
        extra = self.model_extra or {}
        for name in sorted(extra):
            if name in UNSUPPORTED_FIELDS and not _asks_nothing(extra[name], UNSUPPORTED_FIELDS[name]):
                return name
        return None

    def to_backend_parameters(self) -> dict[str, Any]:
        """The generation fields that were given, as sent, for ``parse_parameters``."""
        values = {name: getattr(self, name) for name in self.generation_fields}
        return {name: value for name, value in values.items() if value is not None}


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions`` body."""

    generation_fields: ClassVar[tuple[str, ...]] = GENERATION_FIELDS

    messages: Messages = Field(..., description="chat messages; rules in python_backend.protocol.messages")
    logprobs: OptBoolean = Field(None, description="return log-probabilities of the output tokens")
    top_logprobs: TopLogprobs = Field(None, description="[0, max_logprobs (20 by default)] alternatives per token")
    tools: OptObjects = Field(None, description='function tools ({"type": "function", "function": {...}})')
    tool_choice: OptToolChoice = Field(None, description='"none", "auto", "required" or a named function')
    parallel_tool_calls: OptBoolean = Field(None, description="false: at most one tool call per answer")
    chat_template_kwargs: OptObject = Field(None, description="allow-listed template switches (enable_thinking)")
    response_format: OptObject = Field(None, description='{"type": "text" | "json_object" | "json_schema"}')
    add_generation_prompt: OptBoolean = Field(None, description="open a new assistant turn (default true)")
    continue_final_message: OptBoolean = Field(
        None, description="continue the final assistant message (needs add_generation_prompt false)"
    )
    echo: OptBoolean = Field(None, description="prepend the final message's text when it is the assistant's")

    metadata: Any = Field(None, description="accepted and ignored")
    store: Any = Field(None, description="accepted and ignored")
    service_tier: Any = Field(None, description="accepted and ignored")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _asks_nothing(value: object, neutral: object) -> bool:
    if value is None:
        return True
    if _is_number(neutral):
        return _is_number(value) and value == neutral  # 1 and 1.0 alike, but not True for 1
    if isinstance(neutral, tuple):
        return isinstance(value, list) and tuple(value) == neutral  # JSON arrays arrive as lists
    # Same type as well as equal: false must not pass for 0, nor 1 for true.
    return type(value) is type(neutral) and value == neutral


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(BaseModel):
    """Every non-2xx body (OpenAI's error envelope)."""

    error: ErrorDetail


_ERROR_DESCRIPTIONS = {
    400: "invalid request (the field is named in error.param)",
    401: "missing or invalid API key",
    404: "unknown model or route",
    413: "request body too large",
    429: "overloaded; retry after Retry-After seconds",
    500: "internal error",
    503: "model backend unavailable; retry after Retry-After seconds",
    504: "request timed out",
}


def documented_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for error statuses (all share the envelope)."""
    return {code: {"model": ErrorEnvelope, "description": _ERROR_DESCRIPTIONS[code]} for code in codes}
