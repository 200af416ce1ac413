"""Validation of one chat-completions request body, in the contract's order.

Owns: ``validate_chat_request`` and the ``ValidatedChat`` it returns. Order (docs/api.md, validation):
JSON body -> ``messages`` (``python_backend.protocol.messages``, then the media parts' syntax and policy,
``media.parts.extract_media``, without any I/O) -> body schema, refused known fields (400) and
unknown fields -> ``stream_options`` and ``echo`` -> generation
parameters (``python_backend.protocol.params.parse_parameters``, the backend's own rules) -> ``model``
(404 when not served). The backend is sent the parsed parameters' canonical form
(``GenerationParams.to_wire``), never the body's own spelling. The first failure raises ``ContractError`` naming the field. Media are
loaded only after all of this passed (``media.loader``, called by the route).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from openai_frontend.chat.schemas import ChatCompletionRequest
from openai_frontend.http.errors import info_from_validation_errors
from openai_frontend.media.parts import MediaRef, extract_media
from openai_frontend.settings import FrontendSettings
from python_backend.protocol.errors import ContractError, invalid, invalid_json, model_not_found
from python_backend.protocol.messages import validate_messages
from python_backend.protocol.params import GenerationParams, parse_parameters


@dataclass(frozen=True)
class ValidatedChat:
    """A request that passed every check, with what the route and the formatters need."""

    request: ChatCompletionRequest
    messages: list[dict[str, Any]]  # media parts already rewritten to internal parts (media_index)
    params: GenerationParams  # validated; ``lora`` names the adapter when ``model`` is one
    stream: bool
    include_usage: bool  # OpenAI mode: stream_options.include_usage
    ignored: tuple[str, ...]  # unknown body fields, reported in ``x-ignored-params``
    media: tuple[MediaRef, ...] = ()  # what to load, in media_index order
    continuous_usage: bool = False  # OpenAI mode: usage on every chunk (include_usage as well)
    echo: str = ""  # vLLM's echo: prepended to every choice's reply


@dataclass(frozen=True)
class StreamUsage:
    """What ``stream_options`` asks for."""

    include_usage: bool = False  # a last chunk with the whole request's usage
    continuous: bool = False  # usage on every chunk as well (only with include_usage, as in vLLM)


def _load_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ContractError(invalid_json()) from exc
    if not isinstance(data, dict):
        raise invalid("request body must be a JSON object", None)
    return data


def _stream_usage(request: ChatCompletionRequest, settings: FrontendSettings, stream: bool) -> StreamUsage:
    options = request.stream_options
    if options is None or settings.mindie_mode:
        return StreamUsage()  # MindIE mode has no stream_options; it is reported as ignored instead
    if not stream:
        raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options")
    for key in options:
        if key not in ("include_usage", "continuous_usage_stats"):
            raise invalid(f"'stream_options.{key}' is not supported", f"stream_options.{key}")
    flags = []
    for key in ("include_usage", "continuous_usage_stats"):
        value = options.get(key)
        if value is not None and not isinstance(value, bool):
            raise invalid(f"'stream_options.{key}' must be a boolean", f"stream_options.{key}")
        flags.append(bool(value))
    return StreamUsage(flags[0], flags[0] and flags[1])


def _echo(request: ChatCompletionRequest, messages: list[dict[str, Any]]) -> str:
    """vLLM's chat ``echo``: the final message's text, when that message is the assistant's."""
    if request.echo is None:
        return ""
    if not isinstance(request.echo, bool):
        raise invalid(f"'echo' must be a boolean, got {type(request.echo).__name__}", "echo")
    last = messages[-1]
    if not request.echo or last.get("role") != "assistant":
        return ""
    content = last.get("content")
    if isinstance(content, list):
        # Text parts joined as the chat template sees them.
        return "\n".join(part["text"] for part in content if part.get("type") == "text")
    return content if isinstance(content, str) else ""


def validate_chat_request(body: bytes, settings: FrontendSettings) -> ValidatedChat:
    """Check a raw request body; raise ``ContractError`` (400 or 404) naming the first bad field."""
    data = _load_json(body)
    media = extract_media(validate_messages(data.get("messages")), settings.media)
    try:
        request = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise ContractError(info_from_validation_errors(exc.errors(include_url=False))) from exc

    unsupported = request.unsupported_field()
    if unsupported is not None:
        raise invalid(f"'{unsupported}' is not supported by this server", unsupported)
    ignored = request.unknown_fields()
    if settings.mindie_mode and request.stream_options is not None:
        ignored = sorted([*ignored, "stream_options"])
    if settings.strict_params and ignored:
        raise invalid(f"unknown parameter '{ignored[0]}'", ignored[0])

    stream = bool(request.stream)
    usage = _stream_usage(request, settings, stream)
    echo = _echo(request, media.messages)
    params = parse_parameters(request.to_backend_parameters(), stream=stream)

    if request.model not in settings.model_names:
        raise ContractError(model_not_found(request.model))
    if request.model != settings.served_model_name:
        params = replace(params, lora=request.model)
    return ValidatedChat(
        request, media.messages, params, stream, usage.include_usage, tuple(ignored), media.refs, usage.continuous, echo
    )
