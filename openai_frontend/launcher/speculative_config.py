"""vLLM's ``--speculative-config JSON``, read onto the ``speculative_*`` engine settings.

Owns ``speculative_config``: an argparse type that turns vLLM's object (``{"method": "ngram",
"num_speculative_tokens": 4, "prompt_lookup_max": 5}`` or ``{"model": "/drafts/small",
"num_speculative_tokens": 4}``) into the values of the settings the ``--speculative-*`` flags
set, refusing unknown keys and bad values with a message naming the key. The settings themselves
are declared in ``python_backend/protocol/settings/speculative.py``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

NGRAM = "ngram"
DRAFT_MODEL = "draft_model"
METHODS = (NGRAM, DRAFT_MODEL)
# vLLM's keys this engine has, and (key -> smallest valid value) for the integer ones.
INTEGER_KEYS = {"num_speculative_tokens": 1, "prompt_lookup_min": 1, "prompt_lookup_max": 1, "disable_by_batch_size": 0}
KEYS = ("method", "model", *INTEGER_KEYS)
NGRAM_ONLY = ("prompt_lookup_min", "prompt_lookup_max")
# The settings --speculative-config sets; their --speculative-* flags cannot go with it.
SPECULATIVE_FIELDS = (
    "speculative_ngram_tokens",
    "speculative_ngram_min",
    "speculative_ngram_max",
    "speculative_disable_by_batch_size",
    "speculative_model",
    "speculative_model_tokens",
)
SPECULATIVE_CONFIG_HELP = (
    "speculative decoding as vLLM's JSON: "
    '{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": N, "prompt_lookup_max": N} or '
    '{"model": DIR, "num_speculative_tokens": K} (method draft_model); both also take '
    '"disable_by_batch_size": N. Instead of the --speculative-* flags (default: none, no speculation)'
)


def _error(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def _integer(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(f"'{key}' must be an integer, got {json.dumps(value)}")
    if value < INTEGER_KEYS[key]:
        raise _error(f"'{key}' must be >= {INTEGER_KEYS[key]}, got {value}")
    return value


def _string(config: dict[str, Any], key: str) -> str | None:
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _error(f"'{key}' must be a non-empty string, got {json.dumps(value)}")
    return value


def speculative_config(text: str) -> dict[str, int | str]:
    """An argparse type: vLLM's speculative config as ``{setting name: value}``."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _error(f"not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(config, dict):
        raise _error(f"must be a JSON object, got {json.dumps(config)}")
    for key in config:
        if key not in KEYS:
            raise _error(f"unknown key '{key}' (this engine takes: {', '.join(KEYS)})")
    model = _string(config, "model")
    method = _string(config, "method") or (DRAFT_MODEL if model else None)
    if method is None:
        raise _error(f"'method' is needed ({' or '.join(METHODS)}), or 'model' for a draft model")
    if method not in METHODS:
        raise _error(f"'method' must be {' or '.join(METHODS)}, got '{method}'")
    tokens = _integer(config, "num_speculative_tokens")
    values: dict[str, int | str] = {}
    disable = _integer(config, "disable_by_batch_size")
    if disable is not None:
        values["speculative_disable_by_batch_size"] = disable
    if method == DRAFT_MODEL:
        if model is None:
            raise _error("'model' is needed with method draft_model: the draft model's folder")
        for key in NGRAM_ONLY:
            if key in config:
                raise _error(f"'{key}' is for method ngram, not {DRAFT_MODEL}")
        values["speculative_model"] = model
        if tokens is not None:
            values["speculative_model_tokens"] = tokens
        return values
    if model is not None:
        raise _error("'model' is for method draft_model, not ngram")
    if tokens is None:
        raise _error("'num_speculative_tokens' is needed with method ngram")
    low, high = _integer(config, "prompt_lookup_min"), _integer(config, "prompt_lookup_max")
    # As vLLM: one bound given alone is the other too.
    low, high = (low if low is not None else high), (high if high is not None else low)
    if low is not None and high is not None:
        if low > high:
            raise _error(f"'prompt_lookup_min' ({low}) must be <= 'prompt_lookup_max' ({high})")
        values.update(speculative_ngram_min=low, speculative_ngram_max=high)
    values["speculative_ngram_tokens"] = tokens
    return values
