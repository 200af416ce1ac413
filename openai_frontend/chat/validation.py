"""Validation of one chat-completions request body, in the contract's order.

Owns: ``validate_chat_request`` and the ``ValidatedChat`` it returns, and the steps every
generation endpoint shares (``load_json_object``, ``parse_body``, ``check_generation``). Order
(docs/api.md, validation): JSON body -> every string, keys included, is valid Unicode (``json``
accepts lone surrogate escapes such as ``"\\ud800"``, which no encoder, tokenizer or response can
carry) -> ``messages`` (``python_backend.protocol.messages``, then the media parts' syntax and policy,
``media.parts.extract_media``, without any I/O) -> body schema and unknown fields -> generation
parameters (``python_backend.protocol.params.parse_parameters``, the backend's own rules) -> ``model``
(404 when not served). The backend is sent the parsed parameters' canonical form
(``GenerationParams.to_wire``), never the body's own spelling. The first failure raises ``ContractError`` naming the field. Media are
loaded only after all of this passed (``media.loader``, called by the route).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pydantic import ValidationError

from openai_frontend.chat.schemas import ChatCompletionRequest, GenerationRequest
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


RequestT = TypeVar("RequestT", bound=GenerationRequest)


@dataclass(frozen=True)
class CheckedGeneration:
    """What every generation endpoint's body yields once its shared fields passed."""

    params: GenerationParams  # validated; ``lora`` names the adapter when ``model`` is one
    stream: bool
    include_usage: bool  # OpenAI mode: stream_options.include_usage
    ignored: tuple[str, ...]  # unknown body fields, reported in ``x-ignored-params``


def load_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or the contract's 400."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ContractError(invalid_json()) from exc
    if not isinstance(data, dict):
        raise invalid("request body must be a JSON object", None)
    _require_unicode(data)
    return data


def _escaped(text: str) -> str:
    """``text`` with its lone surrogates written as ``\\udXXX``, safe in any message."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _is_unicode(text: str) -> bool:
    # str.isascii is a flag check; only non-ASCII strings pay for the encode.
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _first_invalid_string(data: Any) -> str | None:
    """The dotted path of the first string (value or key) that is not valid Unicode, if any."""
    pending: list[tuple[str, Any]] = [("", data)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            if not _is_unicode(value):
                return path
        elif isinstance(value, dict):
            children = []
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                if not _is_unicode(key):
                    return _escaped(child)
                children.append((child, item))
            pending.extend(reversed(children))  # depth first, in body order
        elif isinstance(value, list):
            pending.extend(reversed([(f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value)]))
    return None


def _require_unicode(data: dict[str, Any]) -> None:
    path = _first_invalid_string(data)
    if path is not None:
        raise invalid(f"'{path}' is not valid Unicode (it contains a lone surrogate)", path)


def parse_body(schema: type[RequestT], data: dict[str, Any]) -> RequestT:
    """``data`` as the endpoint's schema, or a 400 naming the first bad field."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ContractError(info_from_validation_errors(exc.errors(include_url=False))) from exc


def _include_usage(request: GenerationRequest, settings: FrontendSettings, stream: bool) -> bool:
    options = request.stream_options
    if options is None or settings.mindie_mode:
        return False  # MindIE mode has no stream_options; it is reported as ignored instead
    if not stream:
        raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options")
    for key in options:
        if key != "include_usage":
            raise invalid(f"'stream_options.{key}' is not supported", f"stream_options.{key}")
    value = options.get("include_usage")
    if value is not None and not isinstance(value, bool):
        raise invalid("'stream_options.include_usage' must be a boolean", "stream_options.include_usage")
    return bool(value)


def check_generation(
    request: GenerationRequest, parameters: dict[str, Any], settings: FrontendSettings
) -> CheckedGeneration:
    """Unknown fields, stream options, the generation ``parameters`` and ``model``, in that order."""
    ignored = request.unknown_fields()
    if settings.mindie_mode and request.stream_options is not None:
        ignored = sorted([*ignored, "stream_options"])
    if settings.strict_params and ignored:
        raise invalid(f"unknown parameter '{ignored[0]}'", ignored[0])

    stream = bool(request.stream)
    include_usage = _include_usage(request, settings, stream)
    params = parse_parameters(parameters, stream=stream)

    if request.model not in settings.model_names:
        raise ContractError(model_not_found(request.model))
    if request.model != settings.served_model_name:
        params = replace(params, lora=request.model)
    return CheckedGeneration(params, stream, include_usage, tuple(ignored))


def validate_chat_request(body: bytes, settings: FrontendSettings) -> ValidatedChat:
    """Check a raw request body; raise ``ContractError`` (400 or 404) naming the first bad field."""
    data = load_json_object(body)
    media = extract_media(validate_messages(data.get("messages")), settings.media)
    request = parse_body(ChatCompletionRequest, data)
    checked = check_generation(request, request.to_backend_parameters(), settings)
    return ValidatedChat(
        request, media.messages, checked.params, checked.stream, checked.include_usage, checked.ignored, media.refs
    )
