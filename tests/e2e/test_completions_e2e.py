"""``/v1/completions`` end to end: real tritonserver + frontend, with the openai client and raw HTTP.

Ports the cases of NVIDIA's OpenAI-frontend ``test_completions.py`` that need a real model
(defaults, max_tokens, temperature 0, seed, echo, usage, logprobs); the tiny model's text is
random, so they assert what holds on any model: formats, counts, finish reasons, and equality
between runs and between paths.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.e2e.conftest import TritonHandle
from tests.e2e.test_chat_e2e import check_usage_invariants, client_for, error_body

PROMPT = "What is machine learning?"


def post(url: str, **fields: Any) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/completions", json=fields, timeout=120)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_defaults_answer_a_text_completion_with_usage(triton_server: TritonHandle, frontend_url: str) -> None:
    body = post(frontend_url, model=triton_server.served_model_name, prompt=PROMPT)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    [choice] = body["choices"]
    assert choice["text"] and choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 16  # OpenAI's default max_tokens
    check_usage_invariants(usage)


def test_max_tokens_one_is_one_token(triton_server: TritonHandle, frontend_url: str) -> None:
    short = post(frontend_url, model=triton_server.served_model_name, prompt=PROMPT, max_tokens=1, ignore_eos=True)
    long = post(frontend_url, model=triton_server.served_model_name, prompt=PROMPT, max_tokens=40, ignore_eos=True)
    assert short["usage"]["completion_tokens"] == 1 and short["choices"][0]["finish_reason"] == "length"
    assert long["usage"]["completion_tokens"] == 40


@pytest.mark.parametrize("fields", [{"temperature": 0}, {"seed": 1}, {"seed": 1, "temperature": 1.0}])
def test_same_request_same_text_when_greedy_or_seeded(
    triton_server: TritonHandle, frontend_url: str, fields: dict[str, Any]
) -> None:
    args = {"model": triton_server.served_model_name, "prompt": PROMPT, "max_tokens": 24, "ignore_eos": True, **fields}
    assert post(frontend_url, **args)["choices"][0]["text"] == post(frontend_url, **args)["choices"][0]["text"]


def test_different_seeds_give_different_text(triton_server: TritonHandle, frontend_url: str) -> None:
    args = {"model": triton_server.served_model_name, "prompt": PROMPT, "max_tokens": 24, "ignore_eos": True}
    assert (
        post(frontend_url, **args, seed=1)["choices"][0]["text"]
        != post(frontend_url, **args, seed=2)["choices"][0]["text"]
    )


def test_echo_starts_the_text_with_the_prompt(triton_server: TritonHandle, frontend_url: str) -> None:
    args = {"model": triton_server.served_model_name, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    echoed = post(frontend_url, **args, echo=True)["choices"][0]["text"]
    plain = post(frontend_url, **args, echo=False)["choices"][0]["text"]
    assert echoed == PROMPT + plain and not plain.startswith(PROMPT)


def test_logprobs_in_the_completions_form(triton_server: TritonHandle, frontend_url: str) -> None:
    # ignore_eos: an end-of-sequence token would be listed but is not in the text (see below).
    args = {"model": triton_server.served_model_name, "prompt": PROMPT, "logprobs": 3, "max_tokens": 10}
    body = post(frontend_url, **args, ignore_eos=True)
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    tokens = logprobs["tokens"]
    assert len(tokens) == body["usage"]["completion_tokens"]
    assert (
        len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == len(logprobs["text_offset"]) == len(tokens)
    )
    assert "".join(tokens) == choice["text"]
    assert logprobs["text_offset"] == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    for token, value, top in zip(tokens, logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True):
        assert value <= 0 and 1 <= len(top) <= 3
        assert all(isinstance(k, str) and v <= 0 for k, v in top.items())
        assert max(top.values()) >= value - 1e-4 or token in top
    zero = post(frontend_url, model=triton_server.served_model_name, prompt=PROMPT, logprobs=0, max_tokens=4)
    assert zero["choices"][0]["logprobs"] is None


def test_an_end_of_sequence_token_is_listed_but_not_in_the_text(triton_server: TritonHandle, frontend_url: str) -> None:
    # As in vLLM: the sampled end token counts in completion_tokens and has a log-probability,
    # so it is listed, under its own spelling, at the offset where the text ends.
    tokenizer = AutoTokenizer.from_pretrained(triton_server.settings.model_path)
    eos = tokenizer.eos_token_id
    body = post(
        frontend_url, model=triton_server.served_model_name, prompt=PROMPT, logprobs=2, max_tokens=10,
        logit_bias={str(eos): 100},
    )  # fmt: skip
    choice = body["choices"][0]
    assert choice["text"] == "" and choice["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 1
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [tokenizer.convert_ids_to_tokens(eos)] and logprobs["text_offset"] == [0]
    assert logprobs["token_logprobs"][0] <= 0


def test_openai_client_stream_matches_non_stream(triton_server: TritonHandle, frontend_url: str) -> None:
    client = client_for(frontend_url)
    args: dict[str, Any] = {
        "model": triton_server.served_model_name,
        "prompt": PROMPT,
        "max_tokens": 20,
        "temperature": 0,
    }
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_several_prompts_answer_as_each_alone(triton_server: TritonHandle, frontend_url: str) -> None:
    args = {"model": triton_server.served_model_name, "max_tokens": 12, "temperature": 0}
    prompts = [PROMPT, "Once upon a time"]
    together = post(frontend_url, **args, prompt=prompts)
    alone = [post(frontend_url, **args, prompt=p)["choices"][0]["text"] for p in prompts]
    assert [c["text"] for c in together["choices"]] == alone
    assert together["usage"]["prompt_tokens"] == sum(
        post(frontend_url, **args, prompt=p)["usage"]["prompt_tokens"] for p in prompts
    )


def test_stop_string_ends_the_choice_without_it(triton_server: TritonHandle, frontend_url: str) -> None:
    args = {
        "model": triton_server.served_model_name,
        "prompt": PROMPT,
        "max_tokens": 30,
        "temperature": 0,
        "ignore_eos": True,
    }
    text = post(frontend_url, **args)["choices"][0]["text"]
    stop = text[len(text) // 2 :][:3]
    cut = post(frontend_url, **args, stop=[stop])["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == text[: text.index(stop)]


def test_bad_requests_name_the_field(triton_server: TritonHandle, frontend_url: str) -> None:
    client, model = client_for(frontend_url), triton_server.served_model_name
    with pytest.raises(openai.BadRequestError) as suffix:
        client.completions.create(model=model, prompt=PROMPT, suffix="!")
    with pytest.raises(openai.BadRequestError) as max_tokens:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=-1)
    with pytest.raises(openai.BadRequestError) as empty:
        client.completions.create(model=model, prompt="")
    assert [error_body(e.value)["param"] for e in (suffix, max_tokens, empty)] == ["suffix", "max_tokens", "prompt"]


def tokens_of(url: str, model: str, text: str) -> list[int]:
    response = httpx.post(f"{url}/tokenize", json={"model": model, "prompt": text}, timeout=60)
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


def test_a_prompt_of_token_ids_answers_as_its_text_does(triton_server: TritonHandle, frontend_url: str) -> None:
    client, model = client_for(frontend_url), triton_server.served_model_name
    ids = tokens_of(frontend_url, model, PROMPT)  # what the text prompt is tokenized into
    args: dict[str, Any] = {"model": model, "max_tokens": 12, "temperature": 0}
    as_text = client.completions.create(prompt=PROMPT, **args)
    as_ids = client.completions.create(prompt=ids, **args)
    streamed = list(client.completions.create(prompt=ids, stream=True, stream_options={"include_usage": True}, **args))
    assert as_ids.choices[0].text == as_text.choices[0].text
    assert as_ids.usage is not None and as_ids.usage.prompt_tokens == len(ids)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == as_ids.choices[0].text
    assert streamed[-1].usage is not None and streamed[-1].usage.prompt_tokens == len(ids)


def test_lists_of_token_ids_and_their_echo(triton_server: TritonHandle, frontend_url: str) -> None:
    client, model = client_for(frontend_url), triton_server.served_model_name
    first, second = tokens_of(frontend_url, model, PROMPT), tokens_of(frontend_url, model, "Once upon a time")
    shown = httpx.post(f"{frontend_url}/detokenize", json={"model": model, "tokens": first}, timeout=60).json()
    args: dict[str, Any] = {"model": model, "max_tokens": 6, "temperature": 0}
    both = client.completions.create(prompt=[first, second], **args)
    echoed = client.completions.create(prompt=first, echo=True, **args)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.usage is not None and both.usage.prompt_tokens == len(first) + len(second)
    assert echoed.choices[0].text == shown["prompt"] + both.choices[0].text


@pytest.mark.parametrize("echo", [False, True])
def test_token_ids_outside_the_vocabulary_are_a_400_naming_the_element(
    triton_server: TritonHandle, frontend_url: str, echo: bool
) -> None:
    client, model = client_for(frontend_url), triton_server.served_model_name
    with pytest.raises(openai.BadRequestError) as flat:
        client.completions.create(model=model, prompt=[1, 10**9], echo=echo, max_tokens=2)
    with pytest.raises(openai.BadRequestError) as nested:
        client.completions.create(model=model, prompt=[[1], [1, 2, 10**9]], echo=echo, max_tokens=2)
    with pytest.raises(openai.BadRequestError) as empty:
        client.completions.create(model=model, prompt=[[1], []], echo=echo, max_tokens=2)
    assert [error_body(e.value)["param"] for e in (flat, nested, empty)] == ["prompt.1", "prompt.1.2", "prompt.1"]
    assert "'prompt.1' is 1000000000, outside the vocabulary" in error_body(flat.value)["message"]
