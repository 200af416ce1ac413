"""Per-row sampling rules in a batch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from python_backend.sampling.sampler import RowSampling, sample, take_rows


def row(seed: int = 0, **overrides: Any) -> RowSampling:
    generator = torch.Generator()
    generator.manual_seed(seed)
    neutral = RowSampling(
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        generator=generator,
        top_logprobs=None,
        prompt_ids=torch.tensor([1, 2]),
    )
    return replace(neutral, **overrides)


def test_greedy_top_k_1_and_tiny_top_p_all_pick_the_argmax() -> None:
    logits = torch.randn(3, 100)
    picks = sample(logits, [row(temperature=0.0), row(top_k=1), row(top_p=1e-5)])
    best = logits.argmax(dim=1).tolist()
    assert [p.token_id for p in picks] == best


def test_greedy_takes_the_first_of_tied_maxima_in_any_row_count() -> None:
    # Ties are common in bfloat16 logits: the lowest token id wins, alone and in a batch.
    logits = torch.zeros(64, 49152, dtype=torch.bfloat16)
    logits[:, [30000, 700, 49000]] = 3.0
    logits[5, 12] = 3.0
    for rows in (1, 64):
        picks = sample(logits[:rows], [row(temperature=0.0)] * rows)
        assert [p.token_id for p in picks] == [12 if i == 5 else 700 for i in range(rows)]


def test_plain_greedy_rows_pick_what_rows_with_other_rules_pick() -> None:
    # Plain greedy rows take the argmax of the raw logits, masking only a row whose maximum is
    # suppressed; a row asking for logprobs goes through the widened, masked copy. Both must agree,
    # suppressed maxima, ties among the rest and bfloat16 included.
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 300, generator=generator).to(torch.bfloat16)
    logits[:, 7] = 9.0  # every row's maximum, suppressed in the odd rows
    logits[1, [40, 20]] = 8.0  # tied runners-up: the lower id wins
    suppress = [(7, 2) if i % 2 else () for i in range(8)]
    plain = sample(logits, [row(temperature=0.0, suppress_ids=s) for s in suppress])
    general = sample(logits, [row(temperature=0.0, suppress_ids=s, top_logprobs=0) for s in suppress])
    assert [p.token_id for p in plain] == [p.token_id for p in general]
    assert [p.token_id for p in plain][:2] == [7, 20]
    assert all(p.token_id != 7 for p in plain[1::2])


def test_top_k_limits_the_candidates() -> None:
    logits = torch.arange(50, dtype=torch.float32).unsqueeze(0)
    picks = {sample(logits, [row(seed=s, top_k=3, temperature=5.0)])[0].token_id for s in range(200)}
    assert picks <= {47, 48, 49} and len(picks) == 3


def test_seeded_rows_do_not_depend_on_their_neighbours() -> None:
    logits = torch.randn(1, 500)
    alone = [sample(logits, [row(seed=11)])[0].token_id]
    batch = torch.cat([torch.randn(2, 500), logits, torch.randn(1, 500)])
    together = sample(batch, [row(seed=1), row(seed=2), row(seed=11), row(seed=3, temperature=0.0)])
    assert together[2].token_id == alone[0]


def test_penalties_and_suppression() -> None:
    logits = torch.zeros(1, 10)
    logits[0, 4] = 5.0
    # Token 4 was generated three times: frequency penalty pushes it below its neighbours.
    picks = sample(logits, [row(temperature=0.0, frequency_penalty=2.0, output_ids=[4, 4, 4])])
    assert picks[0].token_id != 4
    picks = sample(logits, [row(temperature=0.0, suppress_ids=(4,))])
    assert picks[0].token_id != 4
    logits[0, 1] = 4.0  # in the prompt: the repetition penalty halves its logit, below token 5's
    logits[0, 5] = 3.0
    assert sample(logits, [row(temperature=0.0, suppress_ids=(4,))])[0].token_id == 1
    picks = sample(logits, [row(temperature=0.0, repetition_penalty=2.0, suppress_ids=(4,))])
    assert picks[0].token_id == 5


def test_logprobs_and_top_logprobs() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    pick = sample(logits, [row(temperature=0.0, top_logprobs=2)])[0]
    expected = torch.log_softmax(logits, dim=1)[0]
    assert pick.token_id == 3
    assert abs(pick.logprob - float(expected[3])) < 1e-6
    assert [t for t, _ in pick.top] == [3, 2]


def test_logit_bias_applies_to_its_own_row_only() -> None:
    logits = torch.randn(3, 64)
    best = logits.argmax(dim=1).tolist()
    forced = 7 if best[1] != 7 else 8
    rows = [row(temperature=0.0), row(temperature=0.0, logit_bias=((forced, 100.0),)), row(seed=5)]
    picks = sample(logits, rows)
    assert picks[0].token_id == best[0]
    assert picks[1].token_id == forced
    # A sampling row without a bias draws what it draws alone.
    assert picks[2].token_id == sample(logits[2:], [row(seed=5)])[0].token_id


def test_logit_bias_of_minus_100_bans_a_token_in_a_sampling_row() -> None:
    logits = torch.zeros(2, 4)
    logits[:, 2] = 3.0
    banned = {sample(logits, [row(seed=s, logit_bias=((2, -100.0),)), row(seed=s)])[0].token_id for s in range(100)}
    unbiased = {sample(logits, [row(seed=s, logit_bias=((2, -100.0),)), row(seed=s)])[1].token_id for s in range(100)}
    assert 2 not in banned and len(banned) == 3
    assert 2 in unbiased


def test_logit_bias_keeps_logprobs_under_the_raw_distribution() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    pick = sample(logits, [row(temperature=0.0, top_logprobs=1, logit_bias=((0, 100.0),))])[0]
    assert pick.token_id == 0
    assert abs(pick.logprob - float(torch.log_softmax(logits, dim=1)[0, 0])) < 1e-6


def test_min_p_drops_unlikely_tokens_per_row() -> None:
    # Probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.5 keeps tokens at >= 0.25, i.e. 0 and 1.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    with_min_p = set()
    without = set()
    for s in range(300):
        picks = sample(logits, [row(seed=s, min_p=0.5), row(seed=s)])
        with_min_p.add(picks[0].token_id)
        without.add(picks[1].token_id)
    assert with_min_p == {0, 1}
    assert without == {0, 1, 2, 3}


def test_min_p_one_keeps_only_the_top_token_and_scales_with_temperature() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert {sample(logits, [row(seed=s, min_p=1.0)])[0].token_id for s in range(50)} == {0}
    # At temperature 3 token 2's probability is above half the top token's: min_p 0.5 keeps it.
    hot = {sample(logits, [row(seed=s, min_p=0.5, temperature=3.0)])[0].token_id for s in range(300)}
    assert hot == {0, 1, 2}


def test_taking_every_row_is_the_tensor_itself_and_a_subset_is_a_copy() -> None:
    logits = torch.randn(4, 10)
    assert take_rows(logits, [0, 1, 2, 3]) is logits
    subset = take_rows(logits, [1, 3])
    assert torch.equal(subset, logits[[1, 3]]) and subset.data_ptr() != logits.data_ptr()
