"""logit_bias, min_p, echo, continue_final_message, json_object and continuous usage through Triton."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

import openai
import pytest
import torch
from openai.types.chat import ChatCompletionMessageParam
from transformers import AutoModelForCausalLM, AutoTokenizer
from tritonclient.utils import InferenceServerException

from python_backend.protocol import contract
from tests.e2e.conftest import TritonHandle
from tests.e2e.test_chat_e2e import QUESTION, client_for, error_body, stream_chunks

PREFILL: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is"},
]
CONTINUE = {"add_generation_prompt": False, "continue_final_message": True}


@pytest.fixture(scope="module")
def tokenizer(triton_server: TritonHandle) -> Any:
    return AutoTokenizer.from_pretrained(triton_server.settings.model_path)


def ask(client: openai.OpenAI, model: str, messages: list[ChatCompletionMessageParam], **fields: Any) -> str:
    reply = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, extra_body={"ignore_eos": True, **fields.pop("extra", {})},
        **fields,
    )  # fmt: skip
    return reply.choices[0].message.content or ""


def test_a_plus_100_bias_forces_its_token_and_an_unknown_id_is_a_400(
    triton_server: TritonHandle, frontend_url: str, tokenizer: Any
) -> None:
    client, model = client_for(frontend_url), triton_server.served_model_name
    token = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    word = tokenizer.decode([token])
    for temperature in (0.0, 1.0):
        forced = ask(client, model, QUESTION, temperature=temperature, seed=1, logit_bias={str(token): 100})
        assert forced == word * 8
    assert ask(client, model, QUESTION, temperature=0) != word * 8
    for bias in ({str(len(tokenizer) + 10_000): 5}, {"Paris": 5}, {str(token): 101}):
        with pytest.raises(openai.BadRequestError) as caught:
            ask(client, model, QUESTION, logit_bias=bias)
        assert error_body(caught.value)["param"] == "logit_bias"


def test_min_p_one_answers_like_greedy(triton_server: TritonHandle, frontend_url: str) -> None:
    client, model = client_for(frontend_url), triton_server.served_model_name
    greedy = ask(client, model, QUESTION, temperature=0)
    hot: dict[str, Any] = {"temperature": 1.5, "seed": 7}
    assert ask(client, model, QUESTION, extra={"min_p": 1.0}, **hot) == greedy
    assert ask(client, model, QUESTION, **hot) != greedy


def greedy_continuation(triton: TritonHandle, tokenizer: Any, new_tokens: int) -> str:
    """What the model itself writes after the open final message (transformers, greedy)."""
    model = AutoModelForCausalLM.from_pretrained(triton.settings.model_path, dtype=torch.float32).eval()
    conversation = cast(list[dict[str, str]], PREFILL)
    text = tokenizer.apply_chat_template(conversation, tokenize=False, **CONTINUE)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    decoded = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert isinstance(decoded, str)
    return decoded


@pytest.mark.parametrize("mode", ["vllm", "openai"])
def test_continue_final_message_continues_and_echo_prepends_it(
    triton_server: TritonHandle, frontend_factory: Callable[..., str], tokenizer: Any, mode: str
) -> None:
    client, model = client_for(frontend_factory(openai_mode=mode)), triton_server.served_model_name
    expected = greedy_continuation(triton_server, tokenizer, 8)
    continued = ask(client, model, PREFILL, temperature=0, extra=CONTINUE)
    assert continued == expected
    assert ask(client, model, PREFILL, temperature=0) != expected  # a new turn says something else
    echoed = ask(client, model, PREFILL, temperature=0, extra={**CONTINUE, "echo": True})
    assert echoed == "The capital of France is" + expected
    stream = client.chat.completions.create(
        model=model, messages=PREFILL, max_tokens=8, temperature=0, stream=True,
        extra_body={"ignore_eos": True, "echo": True, **CONTINUE},
    )  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == echoed
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, model, PREFILL, extra={"continue_final_message": True})  # add_generation_prompt is true
    assert error_body(caught.value)["param"] == "continue_final_message"


def test_json_object_is_an_object_even_when_biased_towards_an_array(
    triton_server: TritonHandle, frontend_url: str, tokenizer: Any
) -> None:
    client, model = client_for(frontend_url), triton_server.served_model_name
    bracket = tokenizer.encode("[", add_special_tokens=False)[0]
    # What LangChain's json_mode sends: response_format json_object, the answer parsed as a dict.
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Answer in JSON."}], max_tokens=40, temperature=0,
        response_format={"type": "json_object"}, logit_bias={str(bracket): 100},
    )  # fmt: skip
    text = reply.choices[0].message.content or ""
    assert text.lstrip().startswith("{")
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("response_channel", [True, False])
def test_continuous_usage_stats_reports_usage_on_every_chunk(
    triton_server: TritonHandle, frontend_factory: Callable[..., str], response_channel: bool
) -> None:
    client = client_for(frontend_factory(openai_mode="openai", response_channel=response_channel))
    # continuous_usage_stats is vLLM's: the client's typed stream_options lacks it.
    every = {"ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = stream_chunks(client, triton_server.served_model_name, 6, extra_body=every)
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages)
    counts = [u.completion_tokens for u in usages if u is not None]
    prompts = {u.prompt_tokens for u in usages if u is not None}
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == 6
    assert len(prompts) == 1 and prompts.pop() > 0
    last_only = {"stream_options": {"include_usage": True, "continuous_usage_stats": False}}
    off = stream_chunks(client, triton_server.served_model_name, 3, extra_body=last_only)
    assert [c.usage is not None for c in off] == [False] * (len(off) - 1) + [True]


def test_known_fields_that_are_not_implemented_are_400s(triton_server: TritonHandle, frontend_url: str) -> None:
    client, model = client_for(frontend_url), triton_server.served_model_name
    for field, value in (("bad_words", ["x"]), ("priority", 3), ("guided_regex", "a+")):
        with pytest.raises(openai.BadRequestError) as caught:
            ask(client, model, QUESTION, extra={field: value})
        assert error_body(caught.value)["param"] == field
    assert ask(client, model, QUESTION, extra={"priority": 0, "prompt_logprobs": None})  # neutral values pass


def infer_text(triton: TritonHandle, parameters: dict[str, Any]) -> str:
    """A non-streaming ``text_input`` request over tritonclient's stream (the model is decoupled)."""
    tensors = {
        contract.TEXT_INPUT: contract.bytes_tensor("The capital of France is"),
        contract.PARAMETERS: contract.json_tensor(parameters),
        contract.EXCLUDE_INPUT_IN_OUTPUT: contract.bool_tensor(True),
    }
    result, error = triton.first_response(tensors, 120)  # one choice, not streamed: one response
    if error is not None:
        raise error
    return contract.read_string(result.as_numpy(contract.TEXT_OUTPUT)) or ""


def test_tritonclient_gets_the_same_logit_bias_rules(triton_server: TritonHandle, tokenizer: Any) -> None:
    token = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    forced = infer_text(
        triton_server, {"max_tokens": 4, "ignore_eos": True, "temperature": 0, "logit_bias": {str(token): 100}}
    )
    assert forced == tokenizer.decode([token]) * 4
    with pytest.raises(InferenceServerException) as caught:
        infer_text(triton_server, {"max_tokens": 4, "logit_bias": {str(len(tokenizer) + 10_000): 1}})
    assert "logit_bias" in str(caught.value)
