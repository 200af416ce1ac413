"""The ``tokenize`` request kind: tokenizing a prompt or chat messages, or detokenizing ids.

Owns: ``TokenizeQuery`` and ``DetokenizeQuery`` (the JSON object of the contract's ``tokenize``
input, one of ``{"prompt": ...}``, ``{"messages": [...], ...}`` or ``{"tokens": [...]}``), their
wire form and its checks, and the answers (``TokenizeAnswer``, ``DetokenizeAnswer``) that travel
back as the JSON ``text_output`` of the request's one final response. The model answers these at
once, outside the batch, with its own tokenizer and chat template: the frontend has neither.
Both edges hold ``prompt``, ``tokens`` and ``tools`` to the input ceilings (``input_limits``) here.
Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from python_backend.protocol.errors import ContractError, invalid, nested_too_deep
from python_backend.protocol.input_limits import MAX_NESTING_DEPTH, check_input_size, check_tools

TOKENIZE_INPUT = "tokenize"  # the contract's input name (contract.TOKENIZE)


def _flag(raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{key}' must be a boolean", key)
    return value


@dataclass(frozen=True)
class TokenizeQuery:
    """Tokenize a raw ``prompt``, or ``messages`` rendered with the model's chat template.

    ``add_special_tokens`` defaults as in vLLM: on for a prompt (the tokenizer's BOS), off for
    messages (the template writes its own special tokens).
    """

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None  # None: the default for the kind above
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def param(self) -> str:
        """The field that carries the text: what an error about it as a whole names."""
        return "prompt" if self.messages is None else "messages"

    @property
    def special_tokens(self) -> bool:
        if self.add_special_tokens is not None:
            return self.add_special_tokens
        return self.messages is None

    def to_wire(self) -> str:
        raw: dict[str, Any] = {}
        if self.messages is not None:
            raw = {"messages": self.messages, "add_generation_prompt": self.add_generation_prompt}
            if self.tools is not None:
                raw["tools"] = self.tools
            if self.chat_template_kwargs:
                raw["chat_template_kwargs"] = self.chat_template_kwargs
        else:
            raw = {"prompt": self.prompt}
        if self.add_special_tokens is not None:
            raw["add_special_tokens"] = self.add_special_tokens
        return json.dumps(raw, ensure_ascii=False)


@dataclass(frozen=True)
class DetokenizeQuery:
    """Turn token ids back into text (special tokens kept, as vLLM's ``/detokenize`` does)."""

    tokens: list[int]
    param = "tokens"  # the field that carries the ids

    def to_wire(self) -> str:
        return json.dumps({"tokens": self.tokens})


@dataclass(frozen=True)
class TokenizeAnswer:
    tokens: list[int]
    max_model_len: int  # prompt plus output tokens the model takes

    @property
    def count(self) -> int:
        return len(self.tokens)

    def to_wire(self) -> str:
        return json.dumps({"count": self.count, "max_model_len": self.max_model_len, "tokens": self.tokens})

    @staticmethod
    def from_wire(text: str) -> TokenizeAnswer:
        raw = json.loads(text)
        return TokenizeAnswer(tokens=[int(t) for t in raw["tokens"]], max_model_len=int(raw["max_model_len"]))


@dataclass(frozen=True)
class DetokenizeAnswer:
    prompt: str

    def to_wire(self) -> str:
        return json.dumps({"prompt": self.prompt}, ensure_ascii=False)

    @staticmethod
    def from_wire(text: str) -> DetokenizeAnswer:
        return DetokenizeAnswer(prompt=str(json.loads(text)["prompt"]))


def check_tokens(value: Any) -> list[int]:
    """``tokens`` of a detokenize request: a non-empty list of non-negative integers."""
    if not isinstance(value, list) or not value:
        raise invalid("'tokens' must be a non-empty list of token ids", "tokens")
    check_input_size(value, "tokens")
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise invalid(f"'tokens.{i}' must be a non-negative integer, got {token!r}", f"tokens.{i}")
    return list(value)


def read_query(text: str) -> TokenizeQuery | DetokenizeQuery:
    """The query of a ``tokenize`` tensor; ``ContractError`` naming the bad key."""
    try:
        raw = json.loads(text)
    except RecursionError as exc:  # the parser recurses per level
        raise ContractError(nested_too_deep(TOKENIZE_INPUT, MAX_NESTING_DEPTH)) from exc
    except json.JSONDecodeError as exc:
        raise invalid(f"tensor '{TOKENIZE_INPUT}' is not valid JSON: {exc.msg}", TOKENIZE_INPUT) from exc
    if not isinstance(raw, dict):
        raise invalid(f"tensor '{TOKENIZE_INPUT}' must be a JSON object", TOKENIZE_INPUT)
    kinds = [key for key in ("prompt", "messages", "tokens") if raw.get(key) is not None]
    if len(kinds) != 1:
        raise invalid("give exactly one of 'prompt', 'messages' and 'tokens'", TOKENIZE_INPUT)
    if kinds[0] == "tokens":
        return DetokenizeQuery(check_tokens(raw["tokens"]))
    special = raw.get("add_special_tokens")
    if special is not None and not isinstance(special, bool):
        raise invalid("'add_special_tokens' must be a boolean", "add_special_tokens")
    if kinds[0] == "prompt":
        if not isinstance(raw["prompt"], str):
            raise invalid("'prompt' must be a string", "prompt")
        check_input_size(raw["prompt"], "prompt")
        return TokenizeQuery(prompt=raw["prompt"], add_special_tokens=special)
    kwargs = raw.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise invalid("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    tools = raw.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid("'tools' must be a list", "tools")
    check_tools(tools)
    return TokenizeQuery(
        messages=raw["messages"],  # checked by the model like a ``messages`` tensor
        add_generation_prompt=_flag(raw, "add_generation_prompt", True),
        add_special_tokens=special,
        tools=tools,
        chat_template_kwargs=kwargs,
    )
