"""The ``tokenize`` tensor's JSON: each query kind survives the wire, bad ones name their key."""

from __future__ import annotations

import pytest

from python_backend.protocol.errors import ContractError
from python_backend.protocol.tokenize import (
    DetokenizeAnswer,
    DetokenizeQuery,
    TokenizeAnswer,
    TokenizeQuery,
    read_query,
)

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    "query",
    [
        TokenizeQuery(prompt="Hello"),
        TokenizeQuery(prompt="Hello", add_special_tokens=False),
        TokenizeQuery(messages=MESSAGES, add_generation_prompt=False),
        TokenizeQuery(messages=MESSAGES, tools=[{"type": "function"}], chat_template_kwargs={"enable_thinking": True}),
        DetokenizeQuery([1, 2, 3]),
    ],
)
def test_queries_survive_the_wire(query: TokenizeQuery | DetokenizeQuery) -> None:
    assert read_query(query.to_wire()) == query


def test_special_tokens_default_by_kind() -> None:
    assert TokenizeQuery(prompt="a").special_tokens is True
    assert TokenizeQuery(messages=MESSAGES).special_tokens is False
    assert TokenizeQuery(messages=MESSAGES, add_special_tokens=True).special_tokens is True


def test_answers_survive_the_wire() -> None:
    answer = TokenizeAnswer(tokens=[5, 6], max_model_len=128)
    assert answer.count == 2 and TokenizeAnswer.from_wire(answer.to_wire()) == answer
    assert DetokenizeAnswer.from_wire(DetokenizeAnswer("héllo").to_wire()) == DetokenizeAnswer("héllo")


@pytest.mark.parametrize(
    ("text", "param"),
    [
        ("not json", "tokenize"),
        ('"a string"', "tokenize"),
        ("{}", "tokenize"),
        ('{"prompt": "a", "messages": []}', "tokenize"),
        ('{"prompt": 3}', "prompt"),
        ('{"prompt": "a", "add_special_tokens": "yes"}', "add_special_tokens"),
        ('{"messages": [], "add_generation_prompt": 1}', "add_generation_prompt"),
        ('{"messages": [], "tools": {}}', "tools"),
        ('{"tokens": []}', "tokens"),
        ('{"tokens": [1, 2.5]}', "tokens.1"),
        ('{"tokens": [false]}', "tokens.0"),
    ],
)
def test_bad_queries_name_the_key(text: str, param: str) -> None:
    with pytest.raises(ContractError) as raised:
        read_query(text)
    assert (raised.value.info.status, raised.value.info.param) == (400, param)
