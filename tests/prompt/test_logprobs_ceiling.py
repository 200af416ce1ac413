"""--max-logprobs in the model: a request over the ceiling is a 400 naming the field and the ceiling,
for callers that skip the frontend too."""

from __future__ import annotations

from typing import Any

import pytest

from python_backend.prompt.inputs import decode_request
from python_backend.protocol import contract
from python_backend.protocol.errors import ContractError


def tensors(parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        contract.MESSAGES: contract.json_tensor([{"role": "user", "content": "hi"}]),
        contract.PARAMETERS: contract.json_tensor(parameters),
    }


@pytest.mark.parametrize("field", ["top_logprobs", "prompt_logprobs"])
def test_over_the_ceiling_is_a_400(tiny_tokenizer: Any, field: str) -> None:
    parameters = {"logprobs": True, field: 6}
    with pytest.raises(ContractError) as caught:
        decode_request(tensors(parameters).get, tiny_tokenizer, frozenset(), max_logprobs=5)
    assert (caught.value.info.status, caught.value.info.param) == (400, field)
    assert "[0, 5]" in caught.value.info.message


def test_a_higher_ceiling_takes_more_than_the_default(tiny_tokenizer: Any) -> None:
    parameters = {"logprobs": True, "top_logprobs": 25, "prompt_logprobs": 25}
    with pytest.raises(ContractError, match=r"\[0, 20\]"):
        decode_request(tensors(parameters).get, tiny_tokenizer, frozenset())
    prepared = decode_request(tensors(parameters).get, tiny_tokenizer, frozenset(), max_logprobs=25)
    assert (prepared.params.top_logprobs, prepared.params.prompt_logprobs) == (25, 25)
