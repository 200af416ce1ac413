"""Ceilings on what one request gives the tokenizer and the chat template, the same at both edges.

Owns ``MAX_INPUT_CHARS`` and ``MAX_NESTING_DEPTH`` and their checks. ``MAX_INPUT_CHARS`` is
MindIE's 4 MB rule for ``messages``, applied to every field whose text reaches the tokenizer or
the template: ``messages``, ``prompt`` in every form (``text_input``, ``prompt_token_ids``), the
``tokens`` to detokenize and ``tools``. A string counts its characters; a list or an object the
characters of its JSON text. ``MAX_NESTING_DEPTH`` bounds how deeply a value the template renders
(a tool's schema, a tool call's arguments, a message) nests: templates walk values recursively,
and a few hundred levels exhaust Python's stack. The frontend checks before anything goes to
Triton, the model again before any work (tritonclient callers skip the frontend). Standard
library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from python_backend.protocol.errors import ContractError, input_too_large, nested_too_deep

MAX_INPUT_CHARS = 4 * 1024 * 1024  # MindIE: messages "greater than 0 and at most 4 MB"
# Levels of arrays and objects within one field: a JSON schema nests two per property level, so
# this is about 30 levels of properties (OpenAI's structured outputs take 10).
MAX_NESTING_DEPTH = 64


def input_chars(value: Any, param: str) -> int:
    """The size ``MAX_INPUT_CHARS`` bounds: a string's characters, else its JSON text's."""
    if isinstance(value, str):
        return len(value)
    try:
        return len(json.dumps(value, ensure_ascii=False))
    except RecursionError as exc:  # the encoder recurses per level: far past the nesting ceiling
        raise ContractError(nested_too_deep(param, MAX_NESTING_DEPTH)) from exc


def check_input_size(value: Any, param: str) -> None:
    """``ContractError`` naming ``param`` when ``value`` is over ``MAX_INPUT_CHARS``."""
    size = input_chars(value, param)
    if size > MAX_INPUT_CHARS:
        raise ContractError(input_too_large(param, size, MAX_INPUT_CHARS))


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects in ``value`` nest more than ``limit`` levels (without recursion)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def check_nesting(value: Any, param: str) -> None:
    """``ContractError`` naming ``param`` when ``value`` nests deeper than ``MAX_NESTING_DEPTH``."""
    if _deeper_than(value, MAX_NESTING_DEPTH):
        raise ContractError(nested_too_deep(param, MAX_NESTING_DEPTH))


def _tool_fields(tools: list[Any] | tuple[Any, ...]) -> Iterator[tuple[str, Any]]:
    """Each tool's fields, ``function``'s one by one, with the dotted name of each."""
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            yield f"tools.{i}", tool
            continue
        for key, value in tool.items():
            if key == "function" and isinstance(value, dict):
                yield from ((f"tools.{i}.function.{name}", item) for name, item in value.items())
            else:
                yield f"tools.{i}.{key}", value


def check_tools(tools: Any) -> None:
    """``tools`` under both ceilings: no field of a tool nests deeper than ``MAX_NESTING_DEPTH``,
    and all of them together are at most ``MAX_INPUT_CHARS``; the error names the field at fault
    (``tools.0.function.parameters``). Their shape is ``parse_parameters``' to check."""
    if not isinstance(tools, list | tuple):  # a body's list, or GenerationParams' tuple
        return
    total = 0
    for param, value in _tool_fields(tools):
        check_nesting(value, param)
        total += input_chars(value, param)
        if total > MAX_INPUT_CHARS:
            raise ContractError(input_too_large(param, total, MAX_INPUT_CHARS, "tools"))
