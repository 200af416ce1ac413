"""The tiny model fixtures load through the Auto classes and tokenize stably."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.fixtures.tiny_models import ENDOFTEXT, IM_END, MARKUP_TOKENS, MULTILINGUAL_LINES, SPECIAL_TOKENS

SAMPLES = (
    "Hello world! The quick brown fox.",
    "def f(x):\n    return x ** 2  # squared\n\n\n",
    "   leading spaces and trailing   ",
    *MULTILINGUAL_LINES,
    "mixed 中文 and English, e\u0301 (decomposed é) and 🇫🇷",
    "<|im_start|>user\nhi<think>plan</think><tool_call>{}</tool_call><|im_end|>",
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.parametrize("fixture_name", ["tiny_model_dir", "tiny_llama_dir"])
def test_reload_encodes_identically(fixture_name: str, tiny_tokenizer: Any, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(fixture_name)
    reloaded = AutoTokenizer.from_pretrained(folder)
    for text in SAMPLES:
        assert reloaded.encode(text) == tiny_tokenizer.encode(text), text
        assert reloaded.decode(reloaded.encode(text)) == tiny_tokenizer.decode(tiny_tokenizer.encode(text))


def test_special_and_markup_tokens_are_single_ids(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for token in (*SPECIAL_TOKENS, *MARKUP_TOKENS):
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == token
    assert tok.eos_token == IM_END and tok.pad_token == ENDOFTEXT
    assert tok.padding_side == "left"
    # Markup tokens must survive skip_special_tokens: the backend parses them from decoded text.
    think = tok.encode("<think>x</think>", add_special_tokens=False)
    assert tok.decode(think, skip_special_tokens=True) == "<think>x</think>"


def test_some_multibyte_characters_split_across_tokens(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    split = [ch for ch in "你好世界😀🎉é" if len(tok.encode(ch, add_special_tokens=False)) > 1]
    assert split, "no multi-byte character is split; the UTF-8 detokenizer tests need some"
    first = tok.encode("😀", add_special_tokens=False)
    assert "\ufffd" in tok.decode(first[:1])  # a lone piece of a character is not valid text


def test_generation_config_stops_on_im_end(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)]
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["rope_theta"] == 10000.0 and config["torch_dtype"] == "float32"
    assert config["hidden_size"] == 64 and config["tie_word_embeddings"] is True


def test_chat_template_with_tools_thinking_and_tool_turns(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need the tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]},
    ]
    text = tok.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "get_weather"' in text
    assert (
        '<think>\nNeed the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>" in text
    assert "<|im_start|>user\nThanks!<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    no_think = tok.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("fixture_name", ["tiny_model_dir", "tiny_llama_dir"])
def test_model_loads_and_generates_deterministically(fixture_name: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(fixture_name)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    batch = tok.apply_chat_template(
        [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "a longer question here"}]],
        add_generation_prompt=True,
        padding=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        first = model.generate(**batch, max_new_tokens=8, do_sample=False)
        second = model.generate(**batch, max_new_tokens=8, do_sample=False)
    assert torch.equal(first, second)
    assert first.shape[1] <= batch["input_ids"].shape[1] + 8


def test_build_is_byte_reproducible(tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path) -> None:
    from tests.fixtures.tiny_models import build_tiny_chat_model

    again = build_tiny_chat_model(tmp_path / "again", "qwen2", tiny_tokenizer)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name
