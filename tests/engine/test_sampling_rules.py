"""logit_bias and min_p through the engine: each request in a batch gets its own rule."""

from __future__ import annotations

from typing import Any

import pytest

from python_backend.protocol.errors import ContractError
from tests.fixtures.engine_driver import Driver


def token_ids(driver: Driver, text: str) -> list[int]:
    return [int(t) for t in driver.loaded.tokenizer.encode(text, add_special_tokens=False)]


def test_a_plus_100_bias_forces_its_token_beside_an_unbiased_request(driver: Driver) -> None:
    token = token_ids(driver, " licence")[0]
    plain = driver.submit("Tell me about licences.", temperature=0, max_tokens=8, ignore_eos=True).wait()
    biased = driver.submit(
        "Tell me about licences.", temperature=0, max_tokens=8, ignore_eos=True, logit_bias={str(token): 100}
    )
    beside = driver.submit("Tell me about licences.", temperature=0, max_tokens=8, ignore_eos=True)
    word = driver.loaded.tokenizer.decode([token])
    assert biased.wait().text() == word * 8
    assert beside.wait().text() == plain.text() != word * 8


def test_a_minus_100_bias_bans_what_greedy_would_pick(driver: Driver) -> None:
    plain = driver.submit("Tell me about licences.", temperature=0, max_tokens=1, ignore_eos=True).wait()
    first = token_ids(driver, plain.text())[0]
    banned = driver.submit(
        "Tell me about licences.", temperature=0, max_tokens=1, ignore_eos=True, logit_bias={str(first): -100}
    ).wait()
    assert banned.text() != plain.text()


def test_an_out_of_vocabulary_bias_is_refused_at_submit(driver: Driver) -> None:
    vocab = driver.loaded.vocab_size
    with pytest.raises(ContractError) as caught:
        driver.submit("hi", logit_bias={str(vocab): 5})
    assert caught.value.info.status == 400 and caught.value.info.param == "logit_bias"


def test_min_p_one_samples_like_greedy_while_its_neighbour_samples_freely(driver: Driver) -> None:
    greedy = driver.submit("Tell me about licences.", temperature=0, max_tokens=12, ignore_eos=True).wait()
    common: dict[str, Any] = {"temperature": 1.5, "max_tokens": 12, "ignore_eos": True, "seed": 3}
    min_p = driver.submit("Tell me about licences.", min_p=1.0, **common)
    free = driver.submit("Tell me about licences.", **common)
    assert min_p.wait().text() == greedy.text()
    assert free.wait().text() != greedy.text()
