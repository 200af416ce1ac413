"""Verifying drafts: greedy accepts the argmax prefix, sampling keeps the exact distribution.

The statistical tests compare outcomes of a verify step over a 6-token vocabulary with those of
plain one-token sampling (independent seeds) by a chi-square test of homogeneity at a 0.1 %
false-alarm rate, and show that the same test rejects a classic wrong rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from python_backend.sampling.sampler import RowSampling, SampledToken, sample
from python_backend.sampling.speculative import verify_drafts
from tests.sampling.test_sampler import row as neutral_row

VOCAB = 6
# Two positions: the logits after the row's last token, and after the draft (token 2).
LOGITS = torch.tensor([[1.2, 0.3, 1.0, -0.5, 0.8, 0.1], [0.2, 1.5, -0.3, 0.9, 0.0, 0.6]])
DRAFTS = [2]
TRIALS = 3000
# Chi-square critical values at p = 0.001 by degrees of freedom (no scipy in the environment).
CRITICAL_0_001 = {5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59, 11: 31.26}

Outcome = tuple[int, ...]


# Every rule that reshapes the distribution at once: temperature, top-p, top-k, a penalty, a bias.
SAMPLING = {
    "temperature": 0.9,
    "top_p": 0.97,
    "top_k": 5,
    "presence_penalty": 0.4,
    "prompt_ids": torch.tensor([0]),
    "logit_bias": ((4, 0.3),),
}


def row(seed: int, **overrides: Any) -> RowSampling:
    return neutral_row(seed, **{**SAMPLING, **overrides})


def speculative(sampling: RowSampling) -> Outcome:
    emitted: list[int] = []

    def emit(token: SampledToken) -> bool:
        emitted.append(token.token_id)
        sampling.output_ids.append(token.token_id)  # what Sequence.accept does: penalties see it
        return False

    verify_drafts(LOGITS, DRAFTS, sampling, lambda: None, emit)
    return tuple(emitted)


def plain(sampling: RowSampling) -> Outcome:
    """Without speculation: one token per step; a second only where the first was the draft
    (the verify step's second logits are the model's answer to exactly that prefix)."""
    first = sample(LOGITS[0:1], [sampling])[0].token_id
    sampling.output_ids.append(first)
    if first != DRAFTS[0]:
        return (first,)
    return (first, sample(LOGITS[1:2], [sampling])[0].token_id)


def wrong_rule(sampling: RowSampling) -> Outcome:
    """A common mistake: on rejection, resample from p without taking the draft out."""
    first = sample(LOGITS[0:1], [sampling])[0].token_id
    if first != DRAFTS[0]:
        first = sample(LOGITS[0:1], [sampling])[0].token_id
    sampling.output_ids.append(first)
    if first != DRAFTS[0]:
        return (first,)
    return (first, sample(LOGITS[1:2], [sampling])[0].token_id)


def outcomes(run: Callable[[RowSampling], Outcome], seed_base: int, **overrides: Any) -> Counter[Outcome]:
    return Counter(run(row(seed_base + i, **overrides)) for i in range(TRIALS))


def chi_square(a: Counter[Outcome], b: Counter[Outcome]) -> tuple[float, int]:
    """Homogeneity statistic of two equal-sized samples, and its degrees of freedom."""
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]  # sparse cells carry no power
    statistic = 0.0
    for key in keys:
        expected = (a[key] + b[key]) / 2
        statistic += (a[key] - expected) ** 2 / expected + (b[key] - expected) ** 2 / expected
    return statistic, len(keys) - 1


def test_sampled_outcomes_have_the_non_speculative_distribution() -> None:
    got = outcomes(speculative, seed_base=0)
    expected = outcomes(plain, seed_base=10**6)
    statistic, dof = chi_square(got, expected)
    assert statistic < CRITICAL_0_001[dof], (statistic, got, expected)
    assert any(len(k) == 2 for k in got)  # the draft was accepted sometimes, and rejected


def test_the_distribution_test_rejects_a_wrong_rule() -> None:
    got = outcomes(wrong_rule, seed_base=0)
    expected = outcomes(plain, seed_base=10**6)
    statistic, dof = chi_square(got, expected)
    assert statistic > CRITICAL_0_001[dof], (statistic, got, expected)


def test_a_seeded_row_draws_the_same_tokens_as_without_speculation() -> None:
    for seed in range(50):
        assert speculative(row(seed)) == plain(row(seed))


def test_greedy_accepts_the_argmax_prefix_then_adds_the_next_argmax() -> None:
    logits = torch.full((4, VOCAB), -1.0)
    logits[0, 3], logits[1, 5], logits[2, 1], logits[3, 0] = 2.0, 2.0, 2.0, 2.0
    emitted: list[int] = []

    def emit(token: SampledToken) -> bool:
        emitted.append(token.token_id)
        return False

    assert verify_drafts(logits, [3, 5, 1], row(0, temperature=0.0), lambda: None, emit) == 3
    assert emitted == [3, 5, 1, 0]  # every draft and the bonus token
    emitted.clear()
    assert verify_drafts(logits, [3, 4, 1], row(0, temperature=0.0), lambda: None, emit) == 1
    assert emitted == [3, 5]  # the first mismatch is replaced by the argmax, and verification stops


def test_verification_stops_at_the_token_that_ends_the_row() -> None:
    logits = torch.full((3, VOCAB), -1.0)
    logits[0, 3], logits[1, 5], logits[2, 1] = 2.0, 2.0, 2.0
    emitted: list[int] = []

    def emit(token: SampledToken) -> bool:
        emitted.append(token.token_id)
        return token.token_id == 5  # e.g. a stop token

    assert verify_drafts(logits, [3, 5], row(0, temperature=0.0), lambda: None, emit) == 2
    assert emitted == [3, 5]
