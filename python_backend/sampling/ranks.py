"""Ranks of tokens under log-probabilities, distinct even where two tokens tie.

Owns ``token_ranks`` (a chosen token's rank) and ``top_tokens`` (the k most likely tokens, in rank
order). bf16 logits tie often, and a rank counting only the strictly more likely tokens gives two
tied tokens both rank 1; vLLM V1 ranks the top k 1..k, distinct. The order here is a total one:
more likely first and, among equal log-probabilities, the lower token id first (the one greedy
decoding picks: ``max`` returns the first maximum). A token's rank is 1 + its place in that order,
so a chosen token's rank is its place in the top list when it is there, and above k when not.
"""

from __future__ import annotations

import torch


def token_ranks(logprobs: torch.Tensor, token_ids: torch.Tensor) -> list[int]:
    """The rank of ``token_ids[r]`` under ``logprobs[r]`` ([rows, vocab]; ``token_ids``: [rows])."""
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))
    ahead = (logprobs > chosen).sum(dim=1)
    ids = torch.arange(logprobs.shape[1], device=logprobs.device).unsqueeze(0)
    tied_before = ((logprobs == chosen) & (ids < token_ids.unsqueeze(1))).sum(dim=1)
    ranks: list[int] = (ahead + tied_before + 1).tolist()
    return ranks


def top_tokens(logprobs: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """The ids and log-probabilities of each row's ``k`` first tokens in rank order (``k`` >= 1)."""
    values, ids = torch.topk(logprobs, k, dim=1)
    floor = values[:, -1:]
    # topk picks any of the tokens tied at the k-th value; where some were left out, take the
    # lowest ids among them instead, as the order says.
    partial = (logprobs == floor).sum(dim=1) > (values == floor).sum(dim=1)
    for row in torch.nonzero(partial).flatten().tolist():
        above = torch.nonzero(logprobs[row] > floor[row]).flatten()
        tied = torch.nonzero(logprobs[row] == floor[row]).flatten()[: k - above.numel()]
        ids[row] = torch.cat([above, tied])
    ids = torch.sort(ids, dim=1).values
    values = logprobs.gather(1, ids)
    # Stable: equal values keep the ascending ids the line above put them in.
    order = torch.sort(values, dim=1, descending=True, stable=True).indices
    return ids.gather(1, order).tolist(), values.gather(1, order).tolist()
