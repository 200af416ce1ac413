"""N-gram proposals (vLLM's matching rule) and the batch cache's rejected positions."""

from __future__ import annotations

import torch

from python_backend.engine.kv_cache import KVBatch
from python_backend.engine.speculative import NgramProposer, Speculator

HEADS, DIM = 2, 3


def test_the_longest_suffix_match_proposes_what_followed_it() -> None:
    # vLLM's documented example: [4, 2, 3] has no earlier match, [2, 3] does; 3 tokens follow it.
    assert NgramProposer(4, 2, 3).lookup([1, 2, 3, 4, 2, 3], limit=10) == [4, 2, 3]
    # The longest n wins over a shorter, later one: [7, 8, 9] matched at the start, not [8, 9].
    context = [7, 8, 9, 1, 2, 5, 8, 9, 3, 4, 7, 8, 9]
    assert NgramProposer(2, 2, 3).lookup(context, limit=10) == [1, 2]


def test_of_equally_long_matches_the_earliest_is_used() -> None:
    assert NgramProposer(1, 2, 2).lookup([5, 6, 1, 5, 6, 2, 5, 6], limit=10) == [1]


def test_no_proposal_below_the_shortest_n_or_past_the_limit() -> None:
    assert NgramProposer(3, 2, 4).lookup([1, 2, 3, 9, 3], limit=10) == []  # only a 1-gram repeats
    assert NgramProposer(3, 1, 4).lookup([1, 2, 3, 9, 3], limit=10) == [9, 3]
    assert NgramProposer(3, 2, 4).lookup([1, 2, 3, 4, 1, 2], limit=2) == [3, 4]
    assert NgramProposer(3, 2, 4).lookup([1, 2, 3, 4, 1, 2], limit=0) == []
    assert NgramProposer(3, 2, 4).lookup([1, 2], limit=5) == []


def test_a_repeating_token_matches_itself_overlapping() -> None:
    assert NgramProposer(4, 2, 3).lookup([9, 9, 9, 9], limit=10) == [9]


def _row(values: list[float]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One layer's [1, heads, positions, dim] keys holding each position's value, values negated."""
    column = torch.tensor(values).view(1, 1, -1, 1).expand(1, HEADS, len(values), DIM).contiguous()
    return [(column, -column)]


def _append(kv: KVBatch, rows: list[list[float]]) -> None:
    """A step that appends the same number of positions to every row."""
    keys = torch.stack([torch.tensor(r) for r in rows]).view(len(rows), 1, -1, 1).expand(-1, HEADS, -1, DIM)
    kv.cache.update(keys.contiguous(), -keys.contiguous(), 0)


def _real_positions(kv: KVBatch) -> list[list[float]]:
    mask = kv.attention_mask(0, torch.device("cpu")).bool()
    keys = kv.cache.layer_states()[0][0][:, 0, :, 0]
    return [keys[i][mask[i]].tolist() for i in range(kv.rows)]


def test_rejected_positions_are_cut_or_masked_then_compacted() -> None:
    kv = KVBatch()
    kv.add_states(_row([1.0, 2.0, 3.0]), copies=1)
    kv.add_states(_row([10.0, 20.0]), copies=1)
    _append(kv, [[4.0, 5.0, 6.0], [30.0, 31.0, 32.0]])
    kv.drop_rejected([1, 2])  # row 0 keeps 4, 5; row 1 keeps 30
    assert kv.length == 5  # the position both rejected is gone
    assert _real_positions(kv) == [[1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 20.0, 30.0]]
    assert kv.hole_count == 1
    _append(kv, [[7.0], [40.0]])  # a plain step after it attends around the hole
    assert _real_positions(kv) == [[1.0, 2.0, 3.0, 4.0, 5.0, 7.0], [10.0, 20.0, 30.0, 40.0]]
    kv.compact()
    assert kv.hole_count == 0 and kv.length == 6 and kv.pad == [0, 2]
    assert _real_positions(kv) == [[1.0, 2.0, 3.0, 4.0, 5.0, 7.0], [10.0, 20.0, 30.0, 40.0]]
    values = kv.cache.layer_states()[0][1]
    assert torch.equal(values, -kv.cache.layer_states()[0][0])


def test_holes_follow_rows_through_joins_and_leaves() -> None:
    kv = KVBatch()
    kv.add_states(_row([1.0, 2.0]), copies=2)
    _append(kv, [[3.0, 4.0], [5.0, 6.0]])
    kv.drop_rejected([0, 1])
    kv.add_states(_row([9.0, 8.0, 7.0, 6.0, 5.0, 4.0]), copies=1)  # longer: the others are re-padded
    assert _real_positions(kv) == [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 5.0], [9.0, 8.0, 7.0, 6.0, 5.0, 4.0]]
    assert kv.keep([1, 2]) == [2, 1]  # the last row moves into the place of the one that left
    assert _real_positions(kv) == [[9.0, 8.0, 7.0, 6.0, 5.0, 4.0], [1.0, 2.0, 5.0]]
    assert kv.hole_count == 1
    assert kv.keep([0]) == [0]
    assert kv.hole_count == 0 and _real_positions(kv) == [[9.0, 8.0, 7.0, 6.0, 5.0, 4.0]]


def test_speculation_is_disabled_only_above_the_batch_threshold() -> None:
    ngram = NgramProposer(4, 2, 3)
    assert [Speculator(ngram, 4).speculates(rows) for rows in (1, 4, 5, 64)] == [True, True, False, False]
    assert Speculator(ngram).speculates(64)  # 0: never disabled
