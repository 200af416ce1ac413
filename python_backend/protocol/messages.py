"""Chat ``messages`` validation: MindIE's rules on roles, content and tool calls.

Owns: the two edges' checks, with the same rules and messages: ``validate_messages`` for the
frontend's HTTP body (media parts as clients send them) and ``validate_tensor_messages`` for the
model's ``messages`` tensor, which may also carry the internal media parts the frontend rewrites
media into (tritonclient callers skip the frontend, so the model checks again). Media parts are
checked for shape here; fetching and decoding them is the media layer's job. The list's size,
each message's nesting and each tool call's parsed arguments' nesting are under the input
ceilings (``input_limits``). No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from python_backend.protocol.errors import ContractError, invalid, nested_too_deep
from python_backend.protocol.input_limits import MAX_NESTING_DEPTH, check_input_size, check_nesting

MEDIA_PART_TYPES = ("image_url", "video_url", "audio_url", "input_audio")
# The backend receives media parts rewritten to these, pointing into the ``media`` tensor.
INTERNAL_MEDIA_TYPES = ("image", "video", "audio")


def function_of(item: Any, shown: str, param: str) -> dict[str, Any]:
    """The ``function`` object of a tool or a tool call, ``{"type": "function", "function":
    {"name": ..., ...}}``; a 400 naming the first bad field (``shown`` in the message, ``param``
    as the field)."""
    if not isinstance(item, dict):
        raise invalid(f"'{shown}' must be an object", param)
    if item.get("type") != "function":
        raise invalid(f"'{shown}.type' must be \"function\"", f"{param}.type")
    function = item.get("function")
    if not isinstance(function, dict):
        raise invalid(f"'{shown}.function' must be an object", f"{param}.function")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise invalid(f"'{shown}.function.name' must be a non-empty string", f"{param}.function.name")
    return function


def _check_tool_calls(calls: Any, where: str) -> None:
    if not isinstance(calls, list):
        raise invalid(f"'{where}' must be a list", where)
    for j, call in enumerate(calls):
        at = f"{where}.{j}"
        if not isinstance(call, dict):
            raise invalid(f"'{at}' must be an object", at)
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise invalid(f"'{at}.id' must be a non-empty string", f"{at}.id")
        function = function_of(call, at, at)
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise invalid(f"'{at}.function.arguments' must be a JSON string", f"{at}.function.arguments")
        try:
            parsed = json.loads(arguments)
        except RecursionError as exc:  # the parser recurses per level
            raise ContractError(nested_too_deep(f"{at}.function.arguments", MAX_NESTING_DEPTH)) from exc
        except ValueError as exc:
            raise invalid(f"'{at}.function.arguments' is not valid JSON", f"{at}.function.arguments") from exc
        check_nesting(parsed, f"{at}.function.arguments")  # the template renders it as an object


def _check_parts(parts: list[Any], where: str, internal_kinds: Collection[str]) -> None:
    if not parts:
        raise invalid(f"'{where}' must not be an empty list", where)
    for k, part in enumerate(parts):
        at = f"{where}.{k}"
        if not isinstance(part, dict):
            raise invalid(f"'{at}' must be an object", at)
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str) or not part["text"]:
                raise invalid(f"'{at}.text' must be a non-empty string", f"{at}.text")
        elif kind in MEDIA_PART_TYPES:
            if part.get(kind) is None:
                raise invalid(f"'{at}.{kind}' is required for a part of type '{kind}'", f"{at}.{kind}")
        elif kind in internal_kinds:
            if not isinstance(part.get("media_index"), int):
                raise invalid(f"'{at}.media_index' must be an integer", f"{at}.media_index")
        else:
            raise invalid(f"'{at}.type' must be one of text, {', '.join(MEDIA_PART_TYPES)}", f"{at}.type")


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check an HTTP body's ``messages`` and return it; raise ``ContractError`` naming the first bad field."""
    return _validate(messages, ())


def validate_tensor_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the ``messages`` tensor (internal media parts allowed) and return it; raise
    ``ContractError`` naming the first bad field."""
    return _validate(messages, INTERNAL_MEDIA_TYPES)


def _validate(messages: Any, internal_kinds: Collection[str]) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list", "messages")
    check_input_size(messages, "messages")
    for i, message in enumerate(messages):
        at = f"messages.{i}"
        if not isinstance(message, dict):
            raise invalid(f"'{at}' must be an object", at)
        check_nesting(message, at)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise invalid(f"'{at}.role' must be a non-empty string", f"{at}.role")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            if role != "assistant":
                raise invalid(f"'{at}.tool_calls' is only allowed for role 'assistant'", f"{at}.tool_calls")
            _check_tool_calls(tool_calls, f"{at}.tool_calls")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid(f"'{at}.tool_call_id' is required for role 'tool'", f"{at}.tool_call_id")
        content = message.get("content")
        if content is None or content == "":
            if role == "assistant" and tool_calls:
                continue
            raise invalid(f"'{at}.content' must not be empty", f"{at}.content")
        if isinstance(content, list):
            _check_parts(content, f"{at}.content", internal_kinds)
        elif not isinstance(content, str):
            raise invalid(f"'{at}.content' must be a string or a list of parts", f"{at}.content")
    return messages
