"""``TritonPythonModel`` answering requests in the vLLM backend's contract, on the tiny model.

The requests are those of the vllm_backend's sample client and CI test: ``text_input``,
``sampling_parameters`` as a tensor and/or as Triton request parameters with numbers as strings,
and the ``return_*`` flags; the responses must be in that backend's formats.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from python_backend.protocol import contract
from tests.adapter.model_driver import Served, chat_request, delta_of, ended_once, error_of
from tests.fakes import pb_utils
from tests.fakes.pb_utils import InferenceRequest, Sent, Tensor

SAMPLE_PARAMETERS = {"temperature": "0.1", "top_p": "0.95", "max_tokens": "100"}  # the sample client's
SAMPLE_PROMPTS = ["Hello, my name is\n", "The most dangerous animal is\n", "The capital of France is\n"]


def vllm_request(
    prompt: str,
    *,
    stream: bool,
    sampling: dict[str, Any] | None = None,
    parameters: dict[str, Any] | None = None,
    flags: dict[str, bool] | None = None,
    request_id: str = "",
) -> InferenceRequest:
    inputs = [
        Tensor(contract.TEXT_INPUT, contract.bytes_tensor(prompt)),
        Tensor(contract.STREAM, contract.bool_tensor(stream)),
    ]
    if sampling is not None:
        inputs.append(Tensor(contract.SAMPLING_PARAMETERS, contract.json_tensor(sampling)))
    inputs += [Tensor(name, contract.bool_tensor(value)) for name, value in (flags or {}).items()]
    return InferenceRequest(inputs, request_id=request_id, parameters=parameters)


def outputs_of(sent: Sent) -> dict[str, np.ndarray]:
    assert sent.response is not None and not sent.response.has_error(), sent.response
    return {t.name(): t.as_numpy() for t in sent.response.output_tensors()}


def run(served: Served, request: InferenceRequest) -> list[dict[str, np.ndarray]]:
    """Every data response of one request, after its single final one."""
    sender = served.answer(request, timeout=120)  # the sample client's 100 tokens, on a busy machine
    finals = sender.finals()
    assert len(finals) == 1 and sender.sent[-1] is finals[0]
    return [outputs_of(s) for s in sender.sent if s.response is not None]


def text(responses: list[dict[str, np.ndarray]]) -> str:
    return "".join(contract.read_string(r[contract.TEXT_OUTPUT]) or "" for r in responses)


def test_the_sample_clients_requests_are_answered_with_the_prompt_first(serve: Callable[..., Served]) -> None:
    served = serve()
    for i, prompt in enumerate(SAMPLE_PROMPTS):
        # As samples/client.py sends them: the tensor and the request parameters, strings.
        request = vllm_request(
            prompt,
            stream=False,
            sampling=SAMPLE_PARAMETERS,
            parameters=SAMPLE_PARAMETERS,
            flags={contract.EXCLUDE_INPUT_IN_OUTPUT: False},
            request_id=str(i),
        )
        responses = run(served, request)
        assert len(responses) == 1
        assert set(responses[0]) == {contract.TEXT_OUTPUT}  # nothing it did not ask for
        assert text(responses).startswith(prompt) and len(text(responses)) > len(prompt)


def test_parameters_sent_only_as_request_parameters_are_used(serve: Callable[..., Served]) -> None:
    served = serve()
    parameters = {"temperature": "0", "max_tokens": "5", "ignore_eos": "true"}
    flags = {contract.RETURN_NUM_OUTPUT_TOKENS: True, contract.RETURN_FINISH_REASON: True}
    responses = run(served, vllm_request("Once upon a time", stream=False, parameters=parameters, flags=flags))
    assert int(responses[0][contract.NUM_OUTPUT_TOKENS][0]) == 5
    assert contract.read_string(responses[0][contract.FINISH_REASON]) == "length"


def test_a_stream_reports_tokens_per_response_and_none_until_finished(serve: Callable[..., Served]) -> None:
    served = serve()
    flags = {name: True for name in contract.RETURN_FLAGS}
    sampling = {"temperature": 0, "max_tokens": 8, "ignore_eos": True, "logprobs": 2}
    responses = run(served, vllm_request("Once upon a time", stream=True, sampling=sampling, flags=flags))
    counts = [int(r[contract.NUM_OUTPUT_TOKENS][0]) for r in responses]
    assert len(responses) >= 2 and all(c > 0 for c in counts) and sum(counts) == 8
    reasons = [contract.read_string(r[contract.FINISH_REASON]) for r in responses]
    assert reasons == ["None"] * (len(responses) - 1) + ["length"]
    cumulative = [float(r[contract.CUMULATIVE_LOGPROB][0]) for r in responses]
    assert all(later < earlier for earlier, later in zip([0.0, *cumulative], cumulative, strict=False))
    for response, count in zip(responses, counts, strict=True):
        tokens = json.loads(contract.read_string(response[contract.LOGPROBS]) or "")
        assert len(tokens) == count
        assert all(1 <= len(entry) <= 3 for entry in tokens)  # the sampled token and the top 2
        ranked_first = [d for entry in tokens for d in entry.values() if d["rank"] == 1]
        assert len(ranked_first) == len(tokens)  # greedy: the sampled token is the most likely
    assert all(int(r[contract.NUM_INPUT_TOKENS][0]) > 0 for r in responses)


def test_without_return_flags_a_response_is_text_only(serve: Callable[..., Served]) -> None:
    served = serve()
    sampling = {"temperature": "0", "max_tokens": "4", "ignore_eos": "true"}
    responses = run(served, vllm_request("Once upon a time", stream=True, sampling=sampling))
    assert responses and all(set(r) == {contract.TEXT_OUTPUT} for r in responses)


def test_logprobs_read_null_when_asked_for_but_not_in_the_parameters(serve: Callable[..., Served]) -> None:
    served = serve()
    flags = {contract.RETURN_LOGPROBS: True}
    responses = run(served, vllm_request("Hi", stream=False, sampling={"max_tokens": "3"}, flags=flags))
    assert contract.read_string(responses[0][contract.LOGPROBS]) == "null"


def test_a_bad_string_number_is_one_error_naming_the_field(serve: Callable[..., Served]) -> None:
    served = serve()
    request = vllm_request("Hi", stream=False, sampling={"temperature": "warm"})
    sender = served.answer(request)
    served.finalize()
    error = error_of(ended_once(sender))
    assert error is not None and error.status == 400 and error.param == "temperature"


def test_our_contract_keeps_its_outputs_beside_vllm_requests(serve: Callable[..., Served]) -> None:
    served = serve()
    ours = chat_request("ours", stream=True, parameters={"max_tokens": 4, "ignore_eos": True})
    sender = served.answer(ours)
    deltas = [d for d in map(delta_of, sender.sent) if d is not None]
    last = sender.sent[-1]
    assert last.response is not None
    assert pb_utils.get_output_tensor_by_name(last.response, contract.USAGE) is not None
    assert deltas[-1].finish_reason == contract.FINISH_LENGTH and deltas[-1].num_output_tokens == 4
    assert all(d.finish_reason is None for d in deltas[:-1])
