"""Answering the contract's ``tokenize`` requests with the model's tokenizer and chat template.

Owns: ``answer_query``: a prompt is encoded as a ``text_input`` prompt would be (with the
tokenizer's special tokens unless asked otherwise); chat messages are checked like a
``messages`` tensor and rendered with the same template, ``tools`` and ``chat_template_kwargs``
a chat request uses, so the count is the one a chat request would be charged; token ids outside
the vocabulary are a 400 naming the first one. Media parts are refused: their placeholder tokens
depend on the media itself.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from python_backend.prompt.chat_template import render_prompt_text
from python_backend.protocol.errors import invalid
from python_backend.protocol.messages import validate_tensor_messages
from python_backend.protocol.params import parse_parameters
from python_backend.protocol.tokenize import DetokenizeAnswer, DetokenizeQuery, TokenizeAnswer, TokenizeQuery


def _text_only(messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for k, part in enumerate(content):
            if part.get("type") != "text":
                raise invalid(
                    f"tokenize takes text parts only; 'messages.{i}.content.{k}' is of type '{part.get('type')}'",
                    f"messages.{i}.content.{k}.type",
                )


def tokenize(query: TokenizeQuery, tokenizer: PreTrainedTokenizerBase, max_model_len: int) -> TokenizeAnswer:
    if query.messages is None:
        text = query.prompt or ""
    else:
        messages = validate_tensor_messages(query.messages)
        _text_only(messages)
        params = parse_parameters(
            {
                "tools": query.tools,
                "chat_template_kwargs": query.chat_template_kwargs or None,
                "add_generation_prompt": query.add_generation_prompt,
            }
        )
        text = render_prompt_text(tokenizer, messages, params)
    ids = tokenizer.encode(text, add_special_tokens=query.special_tokens) if text else []
    return TokenizeAnswer(tokens=[int(i) for i in ids], max_model_len=max_model_len)


def detokenize(query: DetokenizeQuery, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> DetokenizeAnswer:
    for i, token in enumerate(query.tokens):
        if token >= vocab_size:
            raise invalid(f"'tokens.{i}' is {token}, outside the vocabulary (0..{vocab_size - 1})", f"tokens.{i}")
    return DetokenizeAnswer(prompt=str(tokenizer.decode(query.tokens, skip_special_tokens=False)))


def answer_query(
    query: TokenizeQuery | DetokenizeQuery, tokenizer: PreTrainedTokenizerBase, *, max_model_len: int, vocab_size: int
) -> str:
    """The JSON ``text_output`` answering ``query``; ``ContractError`` for a bad one."""
    if isinstance(query, DetokenizeQuery):
        return detokenize(query, tokenizer, vocab_size).to_wire()
    return tokenize(query, tokenizer, max_model_len).to_wire()
