"""The openai client against both API modes, n > 1, logprobs and a LoRA adapter, through Triton."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.e2e.conftest import LORA_NAME, TritonHandle
from tests.e2e.test_chat_e2e import QUESTION, client_for, stream_chunks


def test_openai_mode_streams_with_role_chunk_and_usage_chunk(
    triton_server: TritonHandle, frontend_factory: Callable[..., str]
) -> None:
    client = client_for(frontend_factory(openai_mode="openai"))
    usage = {"include_usage": True}
    chunks = stream_chunks(
        client, triton_server.served_model_name, 6, stream_options=usage, extra_body={"ignore_eos": True}
    )
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    assert all(c.choices[0].delta.role is None for c in chunks[1:-1])
    final_usage = chunks[-1].usage
    assert final_usage is not None
    assert chunks[-1].choices == [] and final_usage.completion_tokens == 6
    assert "batch_size" not in final_usage.model_dump()  # no MindIE extras in OpenAI mode
    reply = client.chat.completions.create(
        model=triton_server.served_model_name, messages=QUESTION, max_completion_tokens=3
    )
    assert reply.usage is not None and reply.usage.completion_tokens <= 3


def test_n_choices_and_logprobs_through_the_openai_client(triton_server: TritonHandle, frontend_url: str) -> None:
    client = client_for(frontend_url)
    reply = client.chat.completions.create(
        model=triton_server.served_model_name, messages=QUESTION, n=3, temperature=0.9, max_tokens=5,
        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage is not None and reply.usage.completion_tokens == 15
    for choice in reply.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        entries = choice.logprobs.content
        assert len(entries) == 5
        assert all(e.bytes and all(0 <= b < 256 for b in e.bytes) for e in entries)
        assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    stream = client.chat.completions.create(
        model=triton_server.served_model_name, messages=QUESTION, n=2, temperature=0.9, max_tokens=4, stream=True
    )
    finals = {c.choices[0].index: c.choices[0].finish_reason for c in stream if c.choices[0].finish_reason}
    assert set(finals) == {0, 1}


def test_lora_adapter_is_listed_and_changes_the_answer(
    triton_server: TritonHandle, frontend_url: str, tiny_model_dir: Path, tiny_lora_dir: Path
) -> None:
    client = client_for(frontend_url)
    assert {m.id for m in client.models.list().data} == {triton_server.served_model_name, LORA_NAME}

    def ask(model: str) -> str:
        reply = client.chat.completions.create(
            model=model, messages=QUESTION, temperature=0, max_tokens=12, extra_body={"ignore_eos": True}
        )
        return reply.choices[0].message.content or ""

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), str(tiny_lora_dir)
    )
    # The question is role and content strings: the shape transformers annotates, as a TypedDict.
    conversation = cast(list[dict[str, str]], QUESTION)
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    out = adapted.eval().generate(**ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    expected = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert ask(LORA_NAME) == expected
    assert ask(triton_server.served_model_name) != expected
