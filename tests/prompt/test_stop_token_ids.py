"""Stop token ids outside the model's vocabulary are a 400 naming the element (only the model
knows its vocabulary; the int32 range is checked by ``parse_parameters`` on both sides)."""

from __future__ import annotations

from typing import Any

import pytest

from python_backend.prompt.inputs import decode_request
from python_backend.protocol import contract
from python_backend.protocol.errors import ContractError


def tensors(stop_token_ids: list[int]) -> dict[str, Any]:
    return {
        contract.MESSAGES: contract.json_tensor([{"role": "user", "content": "hi"}]),
        contract.PARAMETERS: contract.json_tensor({"stop_token_ids": stop_token_ids}),
    }


def test_ids_of_the_vocabulary_are_kept(tiny_tokenizer: Any) -> None:
    last = len(tiny_tokenizer) - 1
    prepared = decode_request(tensors([0, last]).get, tiny_tokenizer, frozenset())
    assert prepared.params.stop_token_ids == (0, last)


@pytest.mark.parametrize("offset", [0, 1000])
def test_an_id_past_the_vocabulary_is_a_400(tiny_tokenizer: Any, offset: int) -> None:
    bad = len(tiny_tokenizer) + offset
    with pytest.raises(ContractError) as caught:
        decode_request(tensors([1, bad]).get, tiny_tokenizer, frozenset())
    assert caught.value.info.status == 400
    assert caught.value.info.param == "stop_token_ids.1"
    assert str(bad) in caught.value.info.message
