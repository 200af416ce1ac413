"""Validation of one chat-completions request body, in the contract's order.

Owns: ``validate_chat_request`` and the ``ValidatedChat`` it returns, and the steps every
generation endpoint shares (``load_json_object``, ``parse_body``, ``check_generation``). Order
(docs/api.md, validation): JSON body -> every string, keys included, is valid Unicode (``json``
accepts lone surrogate escapes such as ``"\\ud800"``, which no encoder, tokenizer or response can
carry) -> ``messages`` (``python_backend.protocol.messages``, then the media parts' syntax and policy,
``media.parts.extract_media``, without any I/O) -> ``tools`` under the input ceilings
(``python_backend.protocol.input_limits``: a schema too deep for the chat template) -> body schema, refused known fields (400) and
unknown fields -> ``stream_options`` -> generation parameters (``python_backend.protocol.params.parse_parameters``, the backend's own rules) -> ``model``
(404 when not served) -> ``echo``. The backend is sent the parsed parameters' canonical form
(``GenerationParams.to_wire``), never the body's own spelling. The first failure raises ``ContractError`` naming the field. Media are
loaded only after all of this passed (``media.loader``, called by the route).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pydantic import ValidationError

from openai_frontend.chat.schemas import ChatCompletionRequest, GenerationRequest
from openai_frontend.http.errors import info_from_validation_errors
from openai_frontend.media.parts import MediaRef, extract_media
from openai_frontend.settings import FrontendSettings
from python_backend.protocol.errors import ContractError, invalid, invalid_json, json_too_deep, model_not_found
from python_backend.protocol.input_limits import check_tools
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


RequestT = TypeVar("RequestT", bound=GenerationRequest)


@dataclass(frozen=True)
class CheckedGeneration:
    """What every generation endpoint's body yields once its shared fields passed."""

    params: GenerationParams  # validated; ``lora`` names the adapter when ``model`` is one
    stream: bool
    include_usage: bool  # OpenAI mode: stream_options.include_usage
    ignored: tuple[str, ...]  # unknown body fields, reported in ``x-ignored-params``
    continuous_usage: bool = False  # OpenAI mode: usage on every chunk (include_usage as well)


@dataclass(frozen=True)
class StreamUsage:
    """What ``stream_options`` asks for."""

    include_usage: bool = False  # a last chunk with the whole request's usage
    continuous: bool = False  # usage on every chunk as well (only with include_usage, as in vLLM)


def load_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or the contract's 400."""
    try:
        data = json.loads(body)
    except RecursionError as exc:  # the parser recurses once per level of arrays and objects
        raise ContractError(json_too_deep(sys.getrecursionlimit())) from exc
    except ValueError as exc:
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


def _stream_usage(request: GenerationRequest, settings: FrontendSettings, stream: bool) -> StreamUsage:
    options = request.stream_options
    if options is None:
        return StreamUsage()  # null means absent
    if not stream:
        # OpenAI's and vLLM's 400 in either mode: whatever the options ask for, there is no stream.
        raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if settings.mindie_mode:
        return StreamUsage()  # MindIE mode has no stream_options; it is reported as ignored instead
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


def check_generation(
    request: GenerationRequest, parameters: dict[str, Any], settings: FrontendSettings
) -> CheckedGeneration:
    """Unknown fields, stream options, the generation ``parameters`` and ``model``, in that order."""
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
    params = parse_parameters(parameters, stream=stream, max_logprobs=settings.max_logprobs)
    if stream and request.prompt_logprobs:
        # vLLM's rule: prompt log-probabilities come with a whole answer only.
        raise invalid("'prompt_logprobs' is not available when 'stream' is true", "prompt_logprobs")

    if request.model not in settings.model_names:
        raise ContractError(model_not_found(request.model))
    if request.model != settings.served_model_name:
        params = replace(params, lora=request.model)
    return CheckedGeneration(params, stream, usage.include_usage, tuple(ignored), usage.continuous)


def validate_chat_request(body: bytes, settings: FrontendSettings) -> ValidatedChat:
    """Check a raw request body; raise ``ContractError`` (400 or 404) naming the first bad field."""
    data = load_json_object(body)
    media = extract_media(validate_messages(data.get("messages")), settings.media)
    check_tools(data.get("tools"))
    request = parse_body(ChatCompletionRequest, data)
    checked = check_generation(request, request.to_backend_parameters(), settings)
    if media.refs and checked.params.prompt_logprobs is not None:
        raise invalid("'prompt_logprobs' is not supported for prompts with media", "prompt_logprobs")
    return ValidatedChat(
        request,
        media.messages,
        checked.params,
        checked.stream,
        checked.include_usage,
        checked.ignored,
        media.refs,
        checked.continuous_usage,
        _echo(request, media.messages),
    )
