"""NVIDIA's own clients against our model, through the real tritonserver, in the vLLM contract.

Three sources of requests, each sent exactly as its client sends it (tensor names, types and the
parameters' JSON) and checked as that client reads the answers:

* NVIDIA's OpenAI frontend with ``--backend vllm`` (``_create_vllm_generate_request`` in the
  server repository's ``python/openai/openai_frontend/engine/utils/triton.py``): a chat prompt it
  templated itself or a completions prompt as ``text_input``, its pydantic request's non-null
  fields as ``sampling_parameters``, ``return_logprobs`` and both ``return_num_*`` flags; it sums
  ``num_output_tokens`` over a stream for the usage it reports.
* The vllm_backend's sample client (``samples/client.py``): string numbers, as a tensor and as
  Triton request parameters.
* The vllm_backend's CI test ``L0_additional_outputs_vllm``: every ``return_*`` combination,
  streaming and not, with ``logprobs`` absent, 0 and 2 (``L0_CASES``); its assertions, per
  request.
"""

from __future__ import annotations

import itertools
import json
import queue
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer

from tests.e2e.conftest import TritonHandle

# NVIDIA's frontend: pydantic defaults of its request schemas that model_dump(exclude_none=True)
# keeps once its own keys (model, messages, stream, max_tokens, logprobs, ...) are excluded.
CHAT_DEFAULTS = {
    "frequency_penalty": 0,
    "ignore_eos": False,
    "n": 1,
    "presence_penalty": 0,
    "temperature": 0.7,
    "top_p": 1,
}
COMPLETION_DEFAULTS = {**CHAT_DEFAULTS, "temperature": 1}
DEFAULT_MAX_TOKENS = 16  # its --default-max-tokens
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
RESPONSE_TIMEOUT_S = 120.0
# Requests in flight at once: below the engine's waiting-queue limit, which refuses the rest.
WINDOW = 64


@dataclass
class Reply:
    """What a client saw for one request: each data response's outputs, or the error."""

    responses: list[dict[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(r["text_output"] for r in self.responses)


def infer_input(name: str, value: Any, datatype: str) -> grpcclient.InferInput:
    array = np.array([value], dtype=np.object_ if datatype == "BYTES" else bool)
    tensor = grpcclient.InferInput(name, [1], datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def send_all(triton: TritonHandle, requests: list[dict[str, Any]]) -> list[Reply]:
    """Send the requests on one gRPC stream, ``WINDOW`` at a time (the engine batches them)."""
    replies = [Reply() for _ in requests]
    finished: queue.Queue[str] = queue.Queue()  # a request ended: its id, or a stream error's text

    def on_response(result: Any, error: Any) -> None:
        if error is not None:
            # A stream error names no request; the test fails with its message.
            finished.put(f"error: {error}")
            return
        response = result.get_response()
        reply = replies[int(response.id)]
        outputs = {o.name: result.as_numpy(o.name) for o in response.outputs}
        if outputs:
            reply.responses.append(_decoded(outputs))
        if response.parameters["triton_final_response"].bool_param:
            finished.put(response.id)

    client = grpcclient.InferenceServerClient(triton.grpc_url)
    client.start_stream(callback=on_response)
    try:
        sent = done = 0
        while done < len(requests):
            while sent < len(requests) and sent - done < WINDOW:
                request = requests[sent]
                client.async_stream_infer(
                    triton.model_name,
                    request["inputs"],
                    request_id=str(sent),
                    parameters=request.get("parameters"),
                    enable_empty_final_response=True,
                )
                sent += 1
            ended = finished.get(timeout=RESPONSE_TIMEOUT_S)
            assert not ended.startswith("error"), ended
            done += 1
    finally:
        client.stop_stream()
        client.close()
    return replies


def _decoded(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    decoded: dict[str, Any] = {}
    for name, array in outputs.items():
        item = array.reshape(-1)[0]
        decoded[name] = item.decode("utf-8") if isinstance(item, bytes) else item
    return decoded


# --- NVIDIA's OpenAI frontend --------------------------------------------------------------------
def nvidia_request(prompt: str, openai: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The tensors NVIDIA's frontend builds for one OpenAI request (its vLLM request builder)."""
    sampling = {**(CHAT_DEFAULTS if chat else COMPLETION_DEFAULTS)}
    sampling.update(
        {k: v for k, v in openai.items() if k not in ("stream", "echo", "max_tokens", "logprobs", "top_logprobs")}
    )
    sampling["max_tokens"] = openai.get("max_tokens", DEFAULT_MAX_TOKENS)
    asked_logprobs = False
    if chat and openai.get("logprobs"):
        sampling["logprobs"] = openai.get("top_logprobs", 1)
        asked_logprobs = True
    elif not chat and openai.get("logprobs"):
        sampling["logprobs"] = openai["logprobs"]
        asked_logprobs = True
    stream = bool(openai.get("stream", False))
    return {
        "inputs": [
            infer_input("return_logprobs", asked_logprobs, "BOOL"),
            infer_input("text_input", prompt.encode(), "BYTES"),
            infer_input("stream", stream, "BOOL"),
            infer_input("exclude_input_in_output", not openai.get("echo", False), "BOOL"),
            infer_input("sampling_parameters", json.dumps(sampling).encode(), "BYTES"),
            infer_input("return_num_input_tokens", True, "BOOL"),
            infer_input("return_num_output_tokens", True, "BOOL"),
        ]
    }


def nvidia_usage(reply: Reply) -> tuple[int, int]:
    """(prompt_tokens, completion_tokens) as NVIDIA's streaming usage accumulator sums them."""
    counted = [r for r in reply.responses if "num_input_tokens" in r and "num_output_tokens" in r]
    assert counted, reply
    return int(counted[0]["num_input_tokens"]), sum(int(r["num_output_tokens"]) for r in counted)


@pytest.fixture(scope="module")
def chat_prompt(triton_server: TritonHandle) -> str:
    # NVIDIA's frontend applies the model's chat template itself and sends the text.
    tokenizer = AutoTokenizer.from_pretrained(triton_server.settings.model_path)
    return str(tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True))


def test_nvidia_frontend_chat_completions_and_streamed_usage(triton_server: TritonHandle, chat_prompt: str) -> None:
    plain = {"temperature": 0, "ignore_eos": True}
    whole, streamed, completion, echoed = send_all(
        triton_server,
        [
            nvidia_request(chat_prompt, {"max_tokens": 8, "temperature": 0, "ignore_eos": True}, chat=True),
            nvidia_request(
                chat_prompt, {"max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True}, chat=True
            ),
            nvidia_request("The capital of France is", {**plain, "max_tokens": 6}, chat=False),
            nvidia_request("The capital of France is", {**plain, "max_tokens": 6, "echo": True}, chat=False),
        ],
    )
    # Non-streaming: it reads the first response only (one or two responses, the last final).
    assert len(whole.responses) == 1 and whole.text
    prompt_tokens, completion_tokens = nvidia_usage(whole)
    assert prompt_tokens > 0 and completion_tokens == 8
    # Streaming: it sums num_output_tokens; per-response counts make that the true total.
    assert len(streamed.responses) >= 2 and nvidia_usage(streamed) == (prompt_tokens, 8)
    assert streamed.text == whole.text
    assert not completion.text.startswith("The capital of France is") and nvidia_usage(completion)[1] == 6
    assert echoed.text == "The capital of France is" + completion.text
    # Nothing its vLLM path did not ask for (finish_reason, cumulative_logprob).
    assert all(set(r) == {"text_output", "num_input_tokens", "num_output_tokens"} for r in whole.responses)


def test_nvidia_frontend_stop_and_seed(triton_server: TritonHandle, chat_prompt: str) -> None:
    greedy = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    (free,) = send_all(triton_server, [nvidia_request(chat_prompt, greedy, chat=True)])
    assert len(free.text) >= 4, free
    stop = free.text[len(free.text) // 2 :][:2]
    sampled = {"max_tokens": 8, "temperature": 1.0, "ignore_eos": True}
    stopped, first, again, other = send_all(
        triton_server,
        [
            nvidia_request(chat_prompt, {**greedy, "stop": [stop]}, chat=True),
            nvidia_request(chat_prompt, {**sampled, "seed": 1234}, chat=True),
            nvidia_request(chat_prompt, {**sampled, "seed": 1234}, chat=True),
            nvidia_request(chat_prompt, {**sampled, "seed": 4321}, chat=True),
        ],
    )
    assert stopped.text == free.text[: free.text.index(stop)]
    assert first.text == again.text and first.text != other.text


def test_nvidia_frontend_logprobs_are_top_n_keyed_by_token(triton_server: TritonHandle, chat_prompt: str) -> None:
    openai = {"max_tokens": 5, "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    whole, streamed = send_all(
        triton_server,
        [
            nvidia_request(chat_prompt, openai, chat=True),
            nvidia_request(chat_prompt, {**openai, "stream": True}, chat=True),
        ],
    )
    for reply in (whole, streamed):
        for response in reply.responses:
            tokens = json.loads(response["logprobs"])
            assert len(tokens) == int(response["num_output_tokens"])
            for entry in tokens:
                # NVIDIA's frontend sorts by rank: the first is the chosen token.
                ranked = sorted(entry.values(), key=lambda d: d["rank"])
                assert ranked[0]["rank"] == 1 and 2 <= len(entry) <= 3


# --- the vllm_backend sample client ----------------------------------------------------------------
SAMPLE_PARAMETERS = {"temperature": "0.1", "top_p": "0.95", "max_tokens": "100"}
SAMPLE_PROMPTS = [
    "Hello, my name is\n",
    "The most dangerous animal is\n",
    "The capital of France is\n",
    "The future of AI is\n",
]


def sample_client_request(prompt: str, stream: bool, as_tensor: bool, exclude: bool) -> dict[str, Any]:
    inputs = [infer_input("text_input", prompt.encode(), "BYTES"), infer_input("stream", stream, "BOOL")]
    if as_tensor:
        inputs.append(infer_input("sampling_parameters", json.dumps(SAMPLE_PARAMETERS).encode(), "BYTES"))
    inputs.append(infer_input("exclude_input_in_output", exclude, "BOOL"))
    return {"inputs": inputs, "parameters": SAMPLE_PARAMETERS}


@pytest.mark.parametrize("as_tensor", [True, False], ids=["tensor", "request-parameters"])
def test_the_sample_clients_prompts_all_pass(triton_server: TritonHandle, as_tensor: bool) -> None:
    replies = send_all(triton_server, [sample_client_request(p, False, as_tensor, False) for p in SAMPLE_PROMPTS])
    for prompt, reply in zip(SAMPLE_PROMPTS, replies, strict=True):
        assert reply.text.startswith(prompt) and len(reply.text) > len(prompt)
    streamed = send_all(triton_server, [sample_client_request(p, True, as_tensor, True) for p in SAMPLE_PROMPTS])
    assert all(r.text for r in streamed)


# --- the vllm_backend's L0_additional_outputs_vllm cases ----------------------------------------
L0_PROMPT = "In this example,"
L0_SAMPLING = {"temperature": "0", "top_p": "1"}
FLAG_NAMES = ("return_finish_reason", "return_cumulative_logprob", "return_logprobs", "return_num_input_tokens",
              "return_num_output_tokens")  # fmt: skip


@dataclass(frozen=True)
class L0Case:
    stream: bool
    logprobs: int | None
    flags: tuple[bool | None, ...]  # FLAG_NAMES' values; None: the input is not sent

    def sampling(self) -> dict[str, Any]:
        return {**L0_SAMPLING, **({"logprobs": self.logprobs} if self.logprobs is not None else {})}

    def request(self) -> dict[str, Any]:
        inputs = [infer_input("text_input", L0_PROMPT.encode(), "BYTES"), infer_input("stream", self.stream, "BOOL")]
        inputs.append(infer_input("sampling_parameters", json.dumps(self.sampling()).encode(), "BYTES"))
        inputs += [infer_input(n, v, "BOOL") for n, v in zip(FLAG_NAMES, self.flags, strict=True) if v is not None]
        return {"inputs": inputs, "parameters": self.sampling()}

    def asked(self, name: str) -> bool:
        return bool(self.flags[FLAG_NAMES.index(name)])


MODES = [(stream, logprobs) for stream in (True, False) for logprobs in (None, 0, 2)]
FLAG_VALUES = (None, True, False)
# Every combination of the five flags (absent, true, false) in one of the six modes, chosen by the
# sum of the values' positions so that each flag's every value meets every mode; then every mode
# with every flag true. The CI test's full product is 1458 requests; this is 249.
L0_CASES = [
    *(
        L0Case(*MODES[sum(FLAG_VALUES.index(v) for v in flags) % len(MODES)], flags)
        for flags in itertools.product(FLAG_VALUES, repeat=len(FLAG_NAMES))
    ),
    *(L0Case(stream, logprobs, (True,) * len(FLAG_NAMES)) for stream, logprobs in MODES),
]


def check_l0_case(case: L0Case, reply: Reply) -> None:
    """The CI test's assertions on one request's responses."""
    assert reply.responses
    assert reply.text.count(" ") > 4, "output is not a sentence"
    last = len(reply.responses) - 1
    previous_cumulative = 0.0
    for i, response in enumerate(reply.responses):
        if case.asked("return_finish_reason"):
            assert response["finish_reason"] == ("None" if i < last else "length")
        else:
            assert "finish_reason" not in response
        if case.asked("return_cumulative_logprob"):
            cumulative = float(response["cumulative_logprob"])
            assert cumulative != previous_cumulative
            previous_cumulative = cumulative
        else:
            assert "cumulative_logprob" not in response
        if case.asked("return_num_input_tokens"):
            assert 0 < int(response["num_input_tokens"]) <= len(L0_PROMPT)
        else:
            assert "num_input_tokens" not in response
        if case.asked("return_num_output_tokens"):
            assert int(response["num_output_tokens"]) > 0
        else:
            assert "num_output_tokens" not in response
        if not case.asked("return_logprobs"):
            assert "logprobs" not in response
            continue
        logprobs = json.loads(response["logprobs"])
        if case.logprobs is None:
            assert logprobs is None
            continue
        assert isinstance(logprobs, list) and len(logprobs) >= 1
        if case.asked("return_num_output_tokens"):
            assert len(logprobs) == int(response["num_output_tokens"])
        chosen = ""
        for entry in logprobs:
            assert 1 <= len(entry) <= case.logprobs + 1
            first = [d for d in entry.values() if d["rank"] == 1]
            assert len(first) == 1
            assert all(isinstance(d["logprob"], float) and isinstance(d["decoded_token"], str) for d in entry.values())
            chosen += first[0]["decoded_token"]
        # Not streaming, the prompt is echoed (exclude_input_in_output is not sent).
        assert (chosen if case.stream else L0_PROMPT + chosen) == response["text_output"]


def test_every_l0_additional_outputs_case_passes(triton_server: TritonHandle) -> None:
    replies = send_all(triton_server, [case.request() for case in L0_CASES])
    failures = []
    for case, reply in zip(L0_CASES, replies, strict=True):
        try:
            check_l0_case(case, reply)
        except AssertionError as exc:
            failures.append(f"{case}: {exc}")
    assert not failures, f"{len(failures)} of {len(L0_CASES)} cases failed, e.g.\n" + "\n".join(failures[:5])


def test_http_generate_reads_sampling_parameters_from_the_request_parameters(triton_server: TritonHandle) -> None:
    # Triton's HTTP generate endpoint turns the body's "parameters" object into request parameters.
    body = {
        "text_input": "The capital of France is",
        "parameters": {"max_tokens": "5", "ignore_eos": "true", "temperature": "0"},
        "return_num_output_tokens": True,
        "return_finish_reason": True,
    }
    with triton_server.http_client(RESPONSE_TIMEOUT_S) as client:
        reply = client.post(f"/v2/models/{triton_server.model_name}/generate", json=body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["num_output_tokens"] == 5 and answer["finish_reason"] == "length"
    assert answer["text_output"].startswith("The capital of France is")
