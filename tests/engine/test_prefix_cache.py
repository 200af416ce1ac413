"""The prefix store: exact longest-prefix lookups, namespaces, LRU bound, redundant entries."""

from __future__ import annotations

import torch

from python_backend.engine.prefix_cache import BLOCK, PrefixCache

LAYERS, HEADS, DIM = 2, 3, 4


def states_for(tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys/values whose every position holds its token id, so a slice shows where it came from."""
    column = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1)
    keys = column.expand(1, HEADS, len(tokens), DIM)
    return [(keys + layer, -(keys + layer)) for layer in range(LAYERS)]


def test_hit_is_the_longest_common_prefix_and_leaves_the_last_token() -> None:
    cache = PrefixCache(capacity_tokens=1000)
    stored = list(range(100, 150))
    cache.insert(stored, states_for(stored))
    prompt = stored[:37] + [7, 8, 9]
    hit = cache.lookup(prompt)
    assert hit is not None and hit.tokens == 37  # exact to the token, not to the block
    keys, values = hit.states[1]
    assert keys.shape == (1, HEADS, 37, DIM)
    assert keys[0, 0, :, 0].tolist() == [t + 1.0 for t in stored[:37]]
    assert torch.equal(values, -keys)
    same = cache.lookup(stored)
    assert same is not None and same.tokens == len(stored) - 1  # the last token is always computed


def test_no_hit_below_one_block_or_on_a_different_start() -> None:
    cache = PrefixCache(capacity_tokens=1000)
    stored = list(range(40))
    cache.insert(stored, states_for(stored))
    assert cache.lookup(stored[: BLOCK - 1] + [999] * 10) is None  # shares less than a block
    assert cache.lookup([999] + stored[1:]) is None
    assert cache.lookup(stored[:BLOCK]) is None  # only BLOCK - 1 tokens could be reused


def test_the_inserted_states_are_copies() -> None:
    cache = PrefixCache(capacity_tokens=1000)
    stored = list(range(32))
    states = states_for(stored)
    source = [(k.clone(), v.clone()) for k, v in states]
    cache.insert(stored, source)
    source[0][0].zero_()
    hit = cache.lookup(stored + [1])
    assert hit is not None and torch.equal(hit.states[0][0], states[0][0])


def test_a_window_of_a_larger_buffer_is_stored_as_a_dense_copy() -> None:
    # A prefill's keys/values are a window of its buffer's spare positions: the entry holds just
    # the window, dense, and does not follow later writes to the buffer.
    cache = PrefixCache(capacity_tokens=1000)
    stored = list(range(40))
    buffers = [(torch.zeros(1, HEADS, 64, DIM), torch.zeros(1, HEADS, 64, DIM)) for _ in range(LAYERS)]
    for (k_buf, v_buf), (k, v) in zip(buffers, states_for(stored), strict=True):
        k_buf[:, :, 8:48], v_buf[:, :, 8:48] = k, v
    cache.insert(stored, [(k[:, :, 8:48], v[:, :, 8:48]) for k, v in buffers])
    for k_buf, v_buf in buffers:
        k_buf.fill_(float("nan"))
        v_buf.fill_(float("nan"))
    hit = cache.lookup(stored + [1])
    assert hit is not None and hit.tokens == len(stored)
    for (keys, values), (k, v) in zip(hit.states, states_for(stored), strict=True):
        assert torch.equal(keys, k) and torch.equal(values, v)
    assert cache.bytes_held == LAYERS * 2 * HEADS * len(stored) * DIM * 4  # the window, not the buffer


def test_adapters_have_separate_namespaces() -> None:
    cache = PrefixCache(capacity_tokens=1000)
    stored = list(range(40))
    cache.insert(stored, states_for(stored), namespace="sql-lora")
    assert cache.lookup(stored) is None
    hit = cache.lookup(stored, namespace="sql-lora")
    assert hit is not None and hit.tokens == 39


def test_lru_eviction_keeps_the_token_bound() -> None:
    cache = PrefixCache(capacity_tokens=100)
    prompts = [[p * 1000 + i for i in range(40)] for p in range(4)]
    cache.insert(prompts[0], states_for(prompts[0]))
    cache.insert(prompts[1], states_for(prompts[1]))
    assert cache.lookup(prompts[0] + [1]) is not None  # touch: 0 is now newer than 1
    cache.insert(prompts[2], states_for(prompts[2]))  # 120 tokens > 100: the oldest (1) goes
    assert cache.tokens_held == 80
    assert cache.lookup(prompts[1] + [1]) is None
    assert cache.lookup(prompts[0] + [1]) is not None
    assert cache.lookup(prompts[2] + [1]) is not None
    assert cache.bytes_held == 80 * LAYERS * 2 * HEADS * DIM * 4


def test_an_entry_that_extends_another_replaces_it() -> None:
    cache = PrefixCache(capacity_tokens=1000)
    turn1 = list(range(40))
    turn2 = turn1 + list(range(500, 530))
    cache.insert(turn1, states_for(turn1))
    cache.insert(turn2, states_for(turn2))
    assert cache.tokens_held == len(turn2)
    hit = cache.lookup(turn1 + [7])
    assert hit is not None and hit.tokens == 40


def test_entries_sharing_a_prefix_stay_reachable_after_one_is_evicted() -> None:
    cache = PrefixCache(capacity_tokens=130)
    system = list(range(32))
    a, b, c = (system + [s] * 20 for s in (900, 901, 902))
    cache.insert(a, states_for(a))
    cache.insert(b, states_for(b))  # b is the newest holder of the shared blocks
    assert cache.lookup(a + [1]) is not None  # a is touched: b is now the oldest
    cache.insert(c, states_for(c))  # over capacity: b goes
    shared = cache.lookup(b + [1])
    assert shared is not None and shared.tokens == 32  # the system part, via a or c
    hit = cache.lookup(a + [1])
    assert hit is not None and hit.tokens == len(a)


def test_disabled_cache_never_hits() -> None:
    cache = PrefixCache(capacity_tokens=0)
    stored = list(range(40))
    cache.insert(stored, states_for(stored))
    assert not cache.enabled and cache.tokens_held == 0 and cache.lookup(stored) is None
