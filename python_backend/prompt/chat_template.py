"""Rendering chat ``messages`` into prompt token ids with the model's own chat template.

Owns: ``render_prompt`` (``render_prompt_text`` then ``encode_chat_prompt``; the text step is
separate because the output plan reads the rendered prompt's end): text-part joining, assistant
tool-call arguments decoded for the template, ``tools``, the allow-listed
``chat_template_kwargs`` and the turn switches (``add_generation_prompt``, or
``continue_final_message``: the final assistant message left open so the reply continues it).
``tools`` are held to the input ceilings (``protocol.input_limits``) before the template runs, so
a schema too deep or too large is a 400 naming it; whatever the template still fails on (its own
``raise_exception``, a value it cannot handle, a recursion too deep) is a 400 naming
``messages`` and one log line, instead of crashing the request path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from python_backend.protocol.errors import invalid
from python_backend.protocol.input_limits import check_tools
from python_backend.protocol.messages import INTERNAL_MEDIA_TYPES, MEDIA_PART_TYPES
from python_backend.protocol.params import GenerationParams

logger = logging.getLogger("triton_chat")

# What a template raises on input it cannot render: jinja2's errors (its raise_exception,
# undefined values), transformers' ValueError (no final message to continue), the Python errors
# of a template expression applied to the wrong kind of value, and a recursion too deep.
_RENDER_ERRORS = (TemplateError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError)
_LOGGED_CHARS = 300  # of the template's error: one line, whatever it says


def _text_content(content: Any, where: str, media_kinds: frozenset[str]) -> Any:
    """Text parts joined the way vLLM does (newline); with media, the parts as they are.

    A multimodal model's template places each media part (``{"type": "image", ...}``) itself.
    """
    if not isinstance(content, list):
        return content
    texts = []
    has_media = False
    for k, part in enumerate(content):
        kind = part.get("type")
        if kind in MEDIA_PART_TYPES or kind in INTERNAL_MEDIA_TYPES:
            if not media_kinds:
                raise invalid(f"this model accepts text only; '{where}.{k}' is of type '{kind}'", f"{where}.{k}.type")
            if kind not in media_kinds:
                raise invalid(
                    f"this model does not accept {kind} input; '{where}.{k}' is of type '{kind}'", f"{where}.{k}.type"
                )
            has_media = True
            continue
        texts.append(part["text"])
    return content if has_media else "\n".join(texts)


def _for_template(messages: list[dict[str, Any]], media_kinds: frozenset[str]) -> list[dict[str, Any]]:
    prepared = []
    for i, message in enumerate(messages):
        item = dict(message)
        item["content"] = _text_content(message.get("content"), f"messages.{i}.content", media_kinds)
        if item["content"] is None:
            item["content"] = ""
        calls = message.get("tool_calls")
        if calls:
            # Templates (Qwen2.5, Hermes) serialise arguments with `tojson`: give them the object,
            # not the JSON string the API carries, or the prompt shows a doubly-quoted string.
            item["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
                for call in calls
            ]
        prepared.append(item)
    return prepared


def render_prompt_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    params: GenerationParams,
    media_kinds: frozenset[str] = frozenset(),
) -> str:
    """Apply the chat template (generation prompt as asked); the text, before tokenization.

    ``media_kinds``: the internal media part types the model takes (none: text only).
    """
    kwargs: dict[str, Any] = dict(params.chat_template_kwargs)
    tools: list[dict[Any, Any] | Callable[..., Any]] | None = (
        list(params.tools) if params.tools and params.tool_choice != "none" else None
    )
    check_tools(params.tools)  # before any work: a 400 naming the tool's field, not the template
    prepared = _for_template(messages, media_kinds)  # its own 400s name the part, not the template
    try:
        text = tokenizer.apply_chat_template(
            prepared,
            tools=tools,
            add_generation_prompt=params.add_generation_prompt,
            continue_final_message=params.continue_final_message,
            tokenize=False,
            **kwargs,
        )
    except _RENDER_ERRORS as exc:
        # Templates raise for conversations they do not support (e.g. roles out of order);
        # transformers raises ValueError when it cannot find the final message to continue.
        # The client's mistake, or the template's: a 400 either way, and no traceback.
        said = " ".join(f"{type(exc).__name__}: {exc}".split())[:_LOGGED_CHARS]
        logger.warning("the chat template could not render a request's messages (%s)", said)
        raise invalid(f"the model's chat template rejected 'messages': {said}", "messages") from exc
    if not isinstance(text, str):
        raise invalid("the model's chat template did not produce text", "messages")
    return text


def encode_chat_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Tokenize a rendered chat prompt."""
    # The template already wrote BOS and role tokens; adding specials again would double them.
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], params: GenerationParams
) -> list[int]:
    """Apply the chat template (generation prompt as asked) and tokenize without extra specials."""
    return encode_chat_prompt(tokenizer, render_prompt_text(tokenizer, messages, params))


def encode_raw_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A ``text_input`` prompt is used as given, with the tokenizer's usual special tokens."""
    if not text:
        raise invalid("'text_input' must not be empty", "text_input")
    return [int(i) for i in tokenizer.encode(text)]
