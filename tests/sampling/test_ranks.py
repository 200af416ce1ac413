"""Ranks under exactly tied log-probabilities: distinct, and the same order everywhere.

bf16 logits tie; vLLM V1 ranks the top k 1..k even then. The rule (``sampling.ranks``): more
likely first, the lower token id first among equals, rank = 1 + place in that order. So the top
list, a sampled token's rank and a prompt token's rank never give two tokens the same rank.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import torch
from test_sampler import row

from python_backend.engine.prompt_scores import PromptScorer
from python_backend.prompt.vllm_compat import logprobs_json
from python_backend.protocol.contract import TokenLogprob, TopLogprob
from python_backend.sampling.ranks import token_ranks, top_tokens
from python_backend.sampling.sampler import sample

# Tokens 1, 2 and 4 tie at the top; 0 is next, then 3.
TIED = torch.tensor([[0.5, 1.0, 1.0, 0.2, 1.0]])


def test_tied_tokens_rank_by_id_after_every_more_likely_one() -> None:
    ids = torch.tensor([0, 1, 2, 3, 4])
    assert token_ranks(TIED.expand(5, -1), ids) == [4, 1, 2, 5, 3]


def test_the_top_list_takes_the_lowest_ids_of_a_tie_at_its_edge() -> None:
    # Row 1 has no tie at all; row 0's third place is one of three equal values.
    logprobs = torch.cat([TIED, torch.tensor([[0.1, 0.4, 0.3, 0.2, 0.0]])])
    ids, values = top_tokens(logprobs, 2)
    assert ids == [[1, 2], [1, 2]]
    assert values == logprobs.gather(1, torch.tensor(ids)).tolist()
    ids, _ = top_tokens(logprobs, 4)
    assert ids == [[1, 2, 4, 0], [1, 2, 3, 0]]
    # Whatever order topk returned them in, a tie is listed by id.
    reversed_vocab = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    assert top_tokens(reversed_vocab, 3)[0] == [[0, 1, 2]]


def test_a_sampled_token_in_a_bf16_tie_has_its_place_in_the_top_list() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0]], dtype=torch.bfloat16)
    greedy = row(temperature=0.0, top_logprobs=3)
    first = sample(logits, [greedy])[0]
    assert first.token_id == 1 and first.rank == 1
    assert [t for t, _ in first.top] == [1, 2, 3]
    # The bias moves the choice to the other tied token; ranks stay the raw distribution's.
    second = sample(logits, [replace(greedy, logit_bias=((2, 100.0),))])[0]
    assert second.token_id == 2 and second.rank == 2
    assert [t for t, _ in second.top] == [1, 2, 3]
    # A row asking for fewer alternatives gets the first of the same order.
    short = sample(logits.expand(2, -1), [replace(greedy, top_logprobs=1), replace(greedy, top_logprobs=0)])
    assert [t for t, _ in short[0].top] == [1] and short[1].top == [] and short[1].rank == 1


def test_the_vllm_form_gives_tied_tokens_distinct_ranks() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0]], dtype=torch.bfloat16)
    picked = sample(logits, [row(temperature=0.0, top_logprobs=2, logit_bias=((2, 100.0),))])[0]
    top = [TopLogprob(str(t), v, [], t) for t, v in picked.top]
    item = TokenLogprob("2", picked.logprob, [], top, picked.token_id, picked.rank)
    [entry] = json.loads(logprobs_json([item]))
    assert {token: e["rank"] for token, e in entry.items()} == {"1": 1, "2": 2}


def test_a_tied_prompt_token_ranks_as_its_top_list_orders_it() -> None:
    # A head whose logits tie tokens 1 and 2: hidden [1, 0] gives logits [1, 2, 2, 0].
    head = torch.nn.Linear(2, 4, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [2.0, 0.0], [2.0, 0.0], [0.0, 0.0]]))
    model = SimpleNamespace(get_output_embeddings=lambda: head, config=SimpleNamespace())
    scorer = PromptScorer(model, lambda token_id: (f"t{token_id}", []))
    with torch.no_grad():
        scored = scorer.score(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), [2, 1], 2)
    assert [(p.token_id, p.rank) for p in scored] == [(2, 2), (1, 1)]
    for position in scored:
        assert [(c.token_id, c.rank) for c in position.top] == [(1, 1), (2, 2)]
