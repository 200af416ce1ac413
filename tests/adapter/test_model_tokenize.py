"""The ``tokenize`` request kind: the model answers with its tokenizer and template, generating nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from python_backend.protocol import contract
from python_backend.protocol.tokenize import DetokenizeQuery, TokenizeQuery
from tests.adapter.model_driver import Served, control_request, ended_once, error_of, text_of

MESSAGES = [{"role": "user", "content": "Hello there"}]


def _ask(served: Served, query: str) -> tuple[Any, Any]:
    request = control_request(contract.TOKENIZE, query, "tokenize-1")
    sender = served.answer(request)
    served.finalize()
    final = ended_once(sender)
    error = error_of(final)
    return (None if error is not None else json.loads(text_of(sender))), error


@pytest.fixture
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_prompt_is_tokenized_as_a_text_input_prompt(serve: Callable[..., Served], tokenizer: Any) -> None:
    answer, error = _ask(serve(max_seq_len="512"), TokenizeQuery(prompt="Hello there").to_wire())
    assert error is None
    assert answer == {
        "count": len(tokenizer.encode("Hello there")),
        "max_model_len": 512,
        "tokens": tokenizer.encode("Hello there"),
    }


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_messages_are_rendered_with_the_chat_template(
    serve: Callable[..., Served], tokenizer: Any, generation_prompt: bool
) -> None:
    query = TokenizeQuery(messages=MESSAGES, add_generation_prompt=generation_prompt)
    answer, error = _ask(serve(), query.to_wire())
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=generation_prompt, tokenize=False)
    assert error is None
    assert answer["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    assert answer["count"] == len(answer["tokens"])


def test_the_generation_prompt_adds_tokens(serve: Callable[..., Served]) -> None:
    with_prompt, _ = _ask(serve(), TokenizeQuery(messages=MESSAGES).to_wire())
    without, _ = _ask(serve(), TokenizeQuery(messages=MESSAGES, add_generation_prompt=False).to_wire())
    assert with_prompt["count"] > without["count"]
    assert with_prompt["tokens"][: without["count"]] == without["tokens"]


def test_ids_are_detokenized_with_special_tokens_kept(serve: Callable[..., Served], tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello there") + [tokenizer.eos_token_id]
    answer, error = _ask(serve(), DetokenizeQuery(ids).to_wire())
    assert error is None
    assert answer == {"prompt": tokenizer.decode(ids, skip_special_tokens=False)}
    assert answer["prompt"].endswith(tokenizer.eos_token)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ('{"tokens": [1, 1000000]}', "tokens.1"),
        ('{"tokens": [-3]}', "tokens.0"),
        (json.dumps({"prompt": "x" * (4 * 1024 * 1024 + 1)}), "prompt"),  # the input ceiling
        (json.dumps({"tokens": [1] * (4 * 1024 * 1024 // 3 + 1)}), "tokens"),
        ("[" * 100_000 + "]" * 100_000, "tokenize"),
        ('{"prompt": "a", "tokens": [1]}', "tokenize"),
        ("[1, 2]", "tokenize"),
        ('{"messages": [{"role": "user", "content": ""}]}', "messages.0.content"),
        (
            '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
            "messages.0.content.0.type",
        ),
        (
            '{"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"x": 1}}',
            "chat_template_kwargs.x",
        ),
    ],
)
def test_a_bad_query_is_a_400_naming_the_field(serve: Callable[..., Served], query: str, param: str) -> None:
    answer, error = _ask(serve(), query)
    assert answer is None and error is not None
    assert (error.status, error.param) == (400, param)
