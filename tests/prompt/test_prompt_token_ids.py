"""The contract's ``prompt_token_ids``: a prompt given as ids is used as it is (no template, no
tokenizing), each id checked against the model's vocabulary."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from python_backend.prompt.inputs import decode_request
from python_backend.protocol import contract
from python_backend.protocol.errors import ContractError


def tensors(ids: Any, **more: Any) -> dict[str, Any]:
    return {contract.PROMPT_TOKEN_IDS: np.array(ids, dtype=np.int32), **more}


def refused(found: dict[str, Any], tokenizer: Any) -> ContractError:
    with pytest.raises(ContractError) as caught:
        decode_request(found.get, tokenizer, frozenset())
    assert caught.value.info.status == 400
    return caught.value


def test_the_ids_are_the_prompt_and_their_text_the_echo(tiny_tokenizer: Any) -> None:
    ids = [int(i) for i in tiny_tokenizer.encode("The capital of France is")]
    last = len(tiny_tokenizer) - 1
    prepared = decode_request(tensors([*ids, last]).get, tiny_tokenizer, frozenset())
    assert prepared.prompt_ids == [*ids, last]  # as given: no BOS, no template
    assert prepared.echo_prompt == tiny_tokenizer.decode([*ids, last], skip_special_tokens=False)
    excluded = tensors(ids, **{contract.EXCLUDE_INPUT_IN_OUTPUT: contract.bool_tensor(True)})
    assert decode_request(excluded.get, tiny_tokenizer, frozenset()).echo_prompt == ""
    streamed = tensors(ids, **{contract.STREAM: contract.bool_tensor(True)})
    assert decode_request(streamed.get, tiny_tokenizer, frozenset()).echo_prompt == ""


@pytest.mark.parametrize("offset", [0, 1000])
def test_an_id_past_the_vocabulary_is_a_400_naming_it(tiny_tokenizer: Any, offset: int) -> None:
    bad = len(tiny_tokenizer) + offset
    error = refused(tensors([1, 2, bad]), tiny_tokenizer)
    assert error.info.param == "prompt_token_ids.2" and str(bad) in error.info.message


def test_a_negative_id_is_a_400_naming_it(tiny_tokenizer: Any) -> None:
    assert refused(tensors([-1, 2]), tiny_tokenizer).info.param == "prompt_token_ids.0"


def test_no_ids_or_ids_that_are_not_integers_are_a_400(tiny_tokenizer: Any) -> None:
    assert refused(tensors([]), tiny_tokenizer).info.param == "prompt_token_ids"
    floats = {contract.PROMPT_TOKEN_IDS: np.array([1.0, 2.0], dtype=np.float32)}
    assert refused(floats, tiny_tokenizer).info.param == "prompt_token_ids"


def test_ids_with_another_prompt_input_are_a_400(tiny_tokenizer: Any) -> None:
    both = tensors([1, 2], **{contract.TEXT_INPUT: contract.bytes_tensor("hi")})
    assert "exactly one" in refused(both, tiny_tokenizer).info.message
