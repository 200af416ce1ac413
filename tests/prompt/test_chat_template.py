"""The chat template's turn switches: a new assistant turn, none, or the final message continued."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from python_backend.prompt.chat_template import render_prompt_text
from python_backend.protocol.errors import ContractError
from python_backend.protocol.params import parse_parameters

PREFILL = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "The colour is"},
]


def test_a_new_assistant_turn_by_default(tiny_tokenizer: Any) -> None:
    text = render_prompt_text(tiny_tokenizer, PREFILL, parse_parameters({}))
    assert text.endswith("The colour is<|im_end|>\n<|im_start|>assistant\n")


def test_add_generation_prompt_false_opens_no_turn(tiny_tokenizer: Any) -> None:
    text = render_prompt_text(tiny_tokenizer, PREFILL[:1], parse_parameters({"add_generation_prompt": False}))
    assert text == "<|im_start|>user\nName a colour.<|im_end|>\n"


def test_continue_final_message_leaves_the_assistant_message_open(tiny_tokenizer: Any) -> None:
    params = parse_parameters({"add_generation_prompt": False, "continue_final_message": True})
    text = render_prompt_text(tiny_tokenizer, PREFILL, params)
    assert text == "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nThe colour is"


def test_continuing_a_message_the_template_drops_is_a_400(tiny_tokenizer: Any) -> None:
    dropping = copy.copy(tiny_tokenizer)  # the session's tokenizer keeps its own template
    dropping.chat_template = "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
    params = parse_parameters({"add_generation_prompt": False, "continue_final_message": True})
    with pytest.raises(ContractError) as caught:
        render_prompt_text(dropping, PREFILL, params)
    assert caught.value.info.status == 400 and caught.value.info.param == "messages"
    assert "final message" in caught.value.info.message
