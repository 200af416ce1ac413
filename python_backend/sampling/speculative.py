"""Verifying one row's speculative draft tokens against the model's distributions.

Owns ``verify_drafts``: given the logits a verify step computed after the row's last token and
after each of its draft tokens, it emits the tokens the row would have produced one step at a
time, and says how many drafts were accepted.

The rule is the standard rejection rule for a deterministic draft ``t`` (a point mass): accept
``t`` with probability ``p(t)`` under the row's fully processed distribution (temperature, top-k,
top-p, min-p, penalties, logit bias, suppression), else emit a token drawn from ``p`` with ``t``
removed and renormalised. Drawing ``x ~ p`` once and accepting ``t`` exactly when ``x == t`` is
that rule: ``t`` comes out with probability ``p(t)``, any other ``x`` with ``p(x)``, which is
``(1 - p(t))`` times its share of ``p`` without ``t``. So each position is sampled by ``sample``
itself, with the row's own generator and one draw per emitted token as without speculation: the
distribution is exactly the non-speculative one, and a seeded row draws the same tokens. A greedy
row accepts the longest prefix equal to the argmax, plus the argmax after it.

Rows whose processing depends on state that a rejected draft would have to roll back (grammar
masks) are not given drafts; the engine decides that.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_backend.sampling.sampler import RowSampling, SampledToken, sample


def verify_drafts(
    logits: torch.Tensor,
    drafts: list[int],
    row: RowSampling,
    before: Callable[[], None],
    emit: Callable[[SampledToken], bool],
) -> int:
    """Emit this row's tokens from ``logits`` [len(drafts) + 1, vocab] (row ``j``: the logits
    after draft ``j - 1``; row 0 after the row's last token); return the drafts accepted.

    ``before()`` runs before each position is sampled (it updates the row's suppression);
    ``emit(token)`` adds the token to the row and returns True when the row has ended, which
    stops verification at exactly that token.
    """
    accepted = 0
    for position in range(len(drafts) + 1):
        before()
        token = sample(logits[position : position + 1], [row])[0]
        # The draft is accepted exactly when the token drawn from p is the draft (the rule above).
        matched = position < len(drafts) and token.token_id == drafts[position]
        accepted += matched
        if emit(token) or not matched:
            break
    return accepted
