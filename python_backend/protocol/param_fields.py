"""One key of the ``parameters`` JSON at a time: its type, its range, and its canonical form.

Owns the readers ``parse_parameters`` (``params.py``) builds ``GenerationParams`` from: numbers,
integers and booleans within a range, and the keys with a shape of their own (``top_k``,
``stop``, ``stop_token_ids``, ``tools``, ``tool_choice``, ``chat_template_kwargs``,
``response_format``, ``logit_bias``), and the limits of the keys' ranges (which the frontend's
JSON schema also shows). Each reader returns the typed value, or None or the default when the
key is not given, and raises ``ContractError`` naming the key. Rules that tie several keys
together stay in ``params.py``. Imports the standard library and ``protocol``'s ``errors`` and
``messages`` only.
"""

from __future__ import annotations

import math
from typing import Any

from python_backend.protocol.errors import invalid
from python_backend.protocol.messages import function_of

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
MAX_STOP_CHARS = 32768
MAX_N = 128
MAX_TOP_LOGPROBS = 20  # the default ceiling of top/prompt logprobs (vLLM's --max-logprobs default)
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: [-100, 100]
CHAT_TEMPLATE_KWARGS_ALLOWED = frozenset({"enable_thinking"})


def _range_message(key: str, lo: float, hi: float, lo_open: bool, value: object) -> str:
    if math.isinf(hi):
        return f"'{key}' must be {'>' if lo_open else '>='} {lo}, got {value}"
    return f"'{key}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}"


def number(raw: dict[str, Any], key: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    """``raw[key]`` as a finite float in [lo, hi] (``(lo, hi]`` when ``lo_open``); None when not given."""
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'{key}' must be a number, got {type(value).__name__}", key)
    if not math.isfinite(value):
        raise invalid(f"'{key}' must be a finite number", key)
    too_low = value <= lo if lo_open else value < lo
    if too_low or value > hi:
        raise invalid(_range_message(key, lo, hi, lo_open, value), key)
    return float(value)


def integer(raw: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    """``raw[key]`` as an int in [lo, hi] (a float with no fraction counts); None when not given."""
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise invalid(f"'{key}' must be an integer, got {type(value).__name__}", key)
    if value < lo or value > hi:
        raise invalid(f"'{key}' must be in [{lo}, {hi}], got {value}", key)
    return int(value)


def boolean(raw: dict[str, Any], key: str, default: bool) -> bool:
    """``raw[key]``, which must be a JSON boolean; ``default`` when not given."""
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{key}' must be a boolean, got {type(value).__name__}", key)
    return value


def top_k(raw: dict[str, Any]) -> int | None:
    value = raw.get("top_k")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'top_k' must be an integer, got {type(value).__name__}", "top_k")
    if value in (-1, 0):
        return 0  # MindIE's own examples send -1 for "no top-k"
    if value < 0 or value > INT32_MAX:
        raise invalid(f"'top_k' must be -1, 0 or in [1, {INT32_MAX}], got {value}", "top_k")
    return value


def stop(raw: dict[str, Any]) -> tuple[str, ...]:
    value = raw.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise invalid("'stop' must be a string or a list of strings", "stop")
    total = 0
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise invalid(f"'stop[{i}]' must be a string", f"stop.{i}")
        if not item:
            raise invalid(f"'stop[{i}]' must not be empty", f"stop.{i}")
        total += len(item)
    if total > MAX_STOP_CHARS:
        raise invalid(f"'stop' strings total {total} characters; the limit is {MAX_STOP_CHARS}", "stop")
    return tuple(items)


def stop_token_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    value = raw.get("stop_token_ids")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("'stop_token_ids' must be a list of integers", "stop_token_ids")
    kept: list[int] = []
    for i, item in enumerate(value):
        if item is None:
            raise invalid(f"'stop_token_ids[{i}]' must not be null", f"stop_token_ids.{i}")
        if isinstance(item, bool) or not isinstance(item, int):
            raise invalid(f"'stop_token_ids[{i}]' must be an integer", f"stop_token_ids.{i}")
        # A token id is an index into the vocabulary (int32 on the wire); the model checks the
        # vocabulary's own size, which only it knows.
        if not 0 <= item <= INT32_MAX:
            raise invalid(f"'stop_token_ids[{i}]' must be in [0, {INT32_MAX}], got {item}", f"stop_token_ids.{i}")
        kept.append(item)
    return tuple(kept)


def _given(raw: dict[str, Any], key: str, kind: type, what: str) -> Any:
    """``raw[key]``, None when not given; a 400 unless it is a ``kind`` (``what`` says one)."""
    value = raw.get(key)
    if value is not None and not isinstance(value, kind):
        raise invalid(f"'{key}' must be {what}", key)
    return value


def tools(raw: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    value = _given(raw, "tools", list, "a list")
    if value is None:
        return ()
    for i, tool in enumerate(value):
        function = function_of(tool, f"tools[{i}]", f"tools.{i}")
        params = function.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise invalid(f"'tools[{i}].function.parameters' must be an object", f"tools.{i}.function.parameters")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid(f"'tools[{i}].function.strict' must be a boolean", f"tools.{i}.function.strict")
    return tuple(value)


def tool_choice(raw: dict[str, Any], tools: tuple[dict[str, Any], ...]) -> str | dict[str, Any] | None:
    value = raw.get("tool_choice")
    if value is None:
        return None
    if not tools:
        # OpenAI answers a tool_choice without tools with a 400, whatever its value.
        raise invalid(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.", "tool_choice"
        )
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise invalid('\'tool_choice\' must be "none", "auto", "required" or a named function', "tool_choice")
        return value
    if isinstance(value, dict):
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if value.get("type") != "function" or not isinstance(name, str):
            raise invalid(
                '\'tool_choice\' object must be {"type": "function", "function": {"name": ...}}', "tool_choice"
            )
        if name not in {t["function"]["name"] for t in tools}:
            raise invalid(f"'tool_choice' names function '{name}', which is not in 'tools'", "tool_choice")
        return value
    raise invalid("'tool_choice' must be a string or an object", "tool_choice")


def chat_template_kwargs(raw: dict[str, Any]) -> dict[str, Any]:
    value = _given(raw, "chat_template_kwargs", dict, "an object")
    if value is None:
        return {}
    for key, item in value.items():
        # An allow-list: template kwargs such as 'tokenize' must never reach apply_chat_template.
        if key not in CHAT_TEMPLATE_KWARGS_ALLOWED:
            allowed = ", ".join(sorted(CHAT_TEMPLATE_KWARGS_ALLOWED))
            raise invalid(
                f"'chat_template_kwargs.{key}' is not supported (allowed: {allowed})", f"chat_template_kwargs.{key}"
            )
        if key == "enable_thinking" and not isinstance(item, bool):
            raise invalid(
                "'chat_template_kwargs.enable_thinking' must be a boolean", "chat_template_kwargs.enable_thinking"
            )
    return dict(value)


def response_format(raw: dict[str, Any]) -> dict[str, Any] | None:
    value = raw.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise invalid('\'response_format.type\' must be "text", "json_object" or "json_schema"', "response_format")
    return None if value["type"] == "text" else value


def logit_bias(raw: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    value = _given(raw, "logit_bias", dict, "an object mapping token ids to biases")
    if value is None:
        return ()
    biases: dict[int, float] = {}
    for key, bias in value.items():
        # OpenAI's keys: token ids written as decimal integers (JSON object keys are strings).
        if not isinstance(key, str) or not key.isascii() or not key.isdigit():
            raise invalid(f"'logit_bias' keys must be token ids (integers as strings), got '{key}'", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise invalid(f"'logit_bias[{key}]' must be a number", "logit_bias")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise invalid(f"'logit_bias[{key}]' must be in [-100, 100], got {bias}", "logit_bias")
        biases[int(key)] = float(bias)
    return tuple(sorted(biases.items()))
