"""A prompt given as ``prompt_token_ids`` through the model: generated from as given, charged its
length, and refused by name when an id is outside the vocabulary."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from python_backend.protocol import contract
from tests.adapter.model_driver import Served, delta_of, ended_once, error_of
from tests.fakes.pb_utils import InferenceRequest, Tensor


def ids_request(request_id: str, ids: list[int]) -> InferenceRequest:
    return InferenceRequest(
        [
            Tensor(contract.PROMPT_TOKEN_IDS, np.array(ids, dtype=np.int32)),
            Tensor(contract.PARAMETERS, contract.json_tensor({"max_tokens": 3, "ignore_eos": True})),
            Tensor(contract.EXCLUDE_INPUT_IN_OUTPUT, contract.bool_tensor(True)),
        ],
        request_id=request_id,
    )


def test_the_prompt_tokens_are_the_ids_given(serve: Callable[..., Served]) -> None:
    served = serve()
    request = ids_request("ids", [5, 6, 7, 8, 9, 10, 11])
    sender = served.answer(request)
    served.finalize()
    delta = delta_of(ended_once(sender))
    assert delta is not None and delta.usage is not None
    assert (delta.usage.prompt_tokens, delta.num_input_tokens, delta.usage.completion_tokens) == (7, 7, 3)


def test_an_id_outside_the_vocabulary_is_one_error_naming_it(serve: Callable[..., Served]) -> None:
    served = serve()
    request = ids_request("outside", [5, 10**9])
    sender = served.answer(request)
    served.finalize()
    error = error_of(ended_once(sender))
    assert error is not None and (error.status, error.param) == (400, "prompt_token_ids.1")
