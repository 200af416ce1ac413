"""Draft-model proposals for speculative decoding: a small model decodes a few tokens ahead of each row.

Owns ``DraftProposer``. Each running row has its own draft KV cache (a transformers
``DynamicCache``) and the list of tokens that cache holds. To propose, the cache is cut back to
the longest prefix it shares with the row's context (what the model accepted may differ from
what the draft proposed), the rest of the context is fed, and the draft decodes greedily.
Greedy drafts are deterministic proposals, so ``sampling/speculative.py``'s verification keeps
a sampled row's distribution exactly (as for n-gram drafts).

Rows are drafted one at a time (no padding or batch cache for the draft): the cost grows with
the running rows, which is why draft models pay at low concurrency. A row's state is dropped once
it is no longer running (``retain``). The draft's caches are not part of the KV budget; they hold
one row's context each, in the draft's much smaller layers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from python_backend.model.draft import DraftModel


@dataclass
class _RowDraft:
    row: object  # the engine's Sequence, held so that its id() is not reused while the state lives
    cache: Any  # DynamicCache over ``covered``
    covered: list[int] = field(default_factory=list)


def _shared_prefix(a: list[int], b: list[int]) -> int:
    count = min(len(a), len(b))
    for i in range(count):
        if a[i] != b[i]:
            return i
    return count


class DraftProposer:
    """Propose up to ``tokens`` tokens per row with the draft model's greedy decoding."""

    def __init__(self, draft: DraftModel, tokens: int) -> None:
        self._draft = draft
        self.tokens = tokens
        self._rows: dict[int, _RowDraft] = {}

    @property
    def rows(self) -> int:
        """Rows with a draft cache (for tests and stats)."""
        return len(self._rows)

    def retain(self, running: Iterable[object]) -> None:
        """Drop the draft state of every row that is not in ``running``."""
        alive = {id(row) for row in running}
        for key in [k for k in self._rows if k not in alive]:
            del self._rows[key]

    def propose(self, seq: object, context: list[int], limit: int) -> list[int]:
        """Up to ``min(tokens, limit)`` greedy draft tokens after ``context``, row ``seq``'s prompt and output."""
        wanted = min(self.tokens, limit)
        if wanted <= 0 or not context:
            return []
        row = self._rows.get(id(seq))
        if row is None:
            row = self._rows[id(seq)] = _RowDraft(seq, DynamicCache(config=self._draft.model.config))
        # At least the last context token is fed: its logits give the first draft.
        kept = min(_shared_prefix(row.covered, context), len(context) - 1)
        if kept < len(row.covered):
            # A negative count removes that many positions (transformers 5 takes only that form).
            row.cache.crop(kept - len(row.covered))
            del row.covered[kept:]
        feed = context[kept:]
        drafts: list[int] = []
        device = self._draft.device
        while True:
            out = self._draft.model(
                input_ids=torch.tensor([feed], dtype=torch.long, device=device),
                use_cache=True,
                logits_to_keep=1,
                **{self._draft.cache_arg: row.cache},
            )
            row.covered.extend(feed)
            token = int(out.logits[0, -1, : self._draft.vocab_size].argmax())
            drafts.append(token)
            if len(drafts) == wanted:
                return drafts
            feed = [token]
