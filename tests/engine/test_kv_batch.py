"""The running batch's cache: rows join and leave without copying the others, and stay exact."""

from __future__ import annotations

import random

import torch

from python_backend.engine.batch_cache import BatchCache, GrowableLayer
from python_backend.engine.kv_cache import KVBatch

HEADS, DIM = 2, 3


def _row(values: list[float]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two layers' [1, heads, positions, dim] keys holding each position's value, values negated."""
    column = torch.tensor(values).view(1, 1, -1, 1).expand(1, HEADS, len(values), DIM).contiguous()
    return [(column, -column), (2 * column, -2 * column)]


def _step(kv: KVBatch, values: list[float]) -> None:
    """A decode step: one position per row, written through the cache as the model writes it."""
    keys = torch.tensor(values).view(-1, 1, 1, 1).expand(-1, HEADS, 1, DIM)
    kv.cache.update(keys, -keys, 0)
    kv.cache.update(2 * keys, -2 * keys, 1)


def _rows(kv: KVBatch) -> list[list[float]]:
    """Each row's real positions (padding dropped), checked against the other layer and the values."""
    rows = []
    (k0, v0), (k1, v1) = kv.cache.layer_states()
    for i, pad in enumerate(kv.pad):
        assert torch.equal(k1[i], 2 * k0[i]) and torch.equal(v0[i], -k0[i]) and torch.equal(v1[i], -k1[i])
        assert torch.equal(k0[i, :, :pad], torch.zeros_like(k0[i, :, :pad]))  # padding is zeros, never stale
        rows.append(k0[i, 0, pad:, 0].tolist())
    mask = kv.attention_mask(0, torch.device("cpu"))
    assert mask.sum(dim=1).tolist() == [len(r) for r in rows]
    return rows


def _buffer(kv: KVBatch) -> int:
    layer = kv.cache.layers[0]
    assert isinstance(layer, GrowableLayer) and layer.keys is not None
    return int(layer.keys.untyped_storage().data_ptr())


def test_random_joins_leaves_and_steps_keep_every_row_exact() -> None:
    rng = random.Random(0)
    kv, expected = KVBatch(), list[list[float]]()
    value = 0.0
    for _ in range(300):
        action = rng.random()
        if action < 0.3 or not expected:
            value += 1
            row = [value * 100 + j for j in range(rng.randint(1, 40))]
            copies = rng.choice([1, 1, 2])
            kv.add_states(_row(row), copies)
            expected += [list(row) for _ in range(copies)]
        elif action < 0.5:
            keep = sorted(rng.sample(range(len(expected)), rng.randint(0, len(expected))))
            order = kv.keep(keep)
            assert sorted(order) == keep
            expected = [expected[i] for i in order]
        else:
            tokens = [rng.random() + 1 for _ in expected]
            _step(kv, tokens)
            for row, token in zip(expected, tokens, strict=True):
                row.append(torch.tensor(token).item())
        if expected:
            assert _rows(kv) == expected
            assert min(kv.pad) == 0  # no column every row pads


def test_a_join_and_a_leave_copy_no_other_row() -> None:
    kv = KVBatch()
    for start in (0.0, 100.0, 200.0, 500.0):
        kv.add_states(_row([start + j for j in range(20 + int(start) // 100)]), 1)  # the buffer grows
    kv.add_states(_row([600.0 + j for j in range(8)]), 1)
    assert kv.keep([0, 1, 2, 4]) == [0, 1, 2, 4]
    for _ in range(3):
        _step(kv, [1.0, 2.0, 3.0, 4.0])
    buffer = _buffer(kv)  # spare rows and spare room on the left now exist
    kv.add_states(_row([300.0 + j for j in range(10)]), 1)  # shorter: padded in a spare row
    kv.add_states(_row([400.0 + j for j in range(40)]), 1)  # longer: the window grows left
    assert kv.keep([0, 2, 3, 4, 5]) == [0, 5, 2, 3, 4]  # the last row fills the place of the one that left
    assert _buffer(kv) == buffer  # every change happened in place
    assert [r[:2] for r in _rows(kv)] == [[0.0, 1.0], [400.0, 401.0], [200.0, 201.0], [600.0, 601.0], [300.0, 301.0]]


def test_rows_join_up_to_the_reserve_without_moving_the_batch() -> None:
    # The running batch reserves max_num_seqs rows: a join below that copies no row, however many
    # joined before it; past the reserve the buffer grows as before, the rows still exact.
    kv = KVBatch(reserve_rows=8)
    kv.add_states(_row([1.0, 2.0, 3.0]), 1)
    buffer = _buffer(kv)
    for i in range(7):
        kv.add_states(_row([10.0 * (i + 1) + j for j in range(2)]), 1)  # shorter: padded in place
    assert _buffer(kv) == buffer and kv.rows == 8
    kv.add_states(_row([90.0, 91.0]), 1)
    assert _buffer(kv) != buffer
    assert [r[0] for r in _rows(kv)] == [1.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 90.0]
    assert kv.keep([]) == [] and kv.rows == 0
    kv.add_states(_row([5.0]), 1)  # an emptied batch starts again with its reserve
    buffer = _buffer(kv)
    for i in range(7):
        kv.add_states(_row([6.0 + i]), 1)
    assert _buffer(kv) == buffer and [r[0] for r in _rows(kv)] == [5.0 + i for i in range(8)]


def test_a_window_that_slides_right_moves_back_inside_its_buffer() -> None:
    # Rows leave from the left as others keep decoding: the window slides right past the buffer's
    # end many times over, and each time it moves back inside the same buffer, rows exact.
    kv = KVBatch(reserve_rows=4)
    kv.add_states(_row([float(j) for j in range(300)]), 1)
    kv.add_states(_row([1000.0 + j for j in range(10)]), 1)
    buffer = _buffer(kv)
    layer = kv.cache.layers[0]
    assert isinstance(layer, GrowableLayer) and layer.keys is not None
    positions = layer.keys.untyped_storage().nbytes() // (4 * HEADS * DIM * 4)  # 4 reserve rows, float32
    expected = [[float(j) for j in range(300)], [1000.0 + j for j in range(10)]]
    assert kv.keep([1]) == [1]  # the long row leaves: the window's left is trimmed
    expected = expected[1:]
    for step in range(3 * positions):
        if step % 50 == 49:  # now and then a short row joins and the oldest leaves
            row = [2000.0 + step + j for j in range(5)]
            kv.add_states(_row(row), 1)
            assert kv.keep([1]) == [1]
            expected = [row]
        _step(kv, [float(step)])
        expected[0].append(float(step))
        assert _rows(kv) == expected
    assert _buffer(kv) == buffer


def _prefill_cache(values: list[float]) -> BatchCache:
    """A prompt's own one-row cache, written through ``update`` as a prefill writes it."""
    cache = BatchCache()
    for layer, (keys, values_) in enumerate(_row(values)):
        cache.update(keys, values_, layer)
    return cache


def test_an_empty_batch_adopts_a_prompt_cache_and_grows_to_its_reserve() -> None:
    kv = KVBatch(reserve_rows=8)
    cache = _prefill_cache([1.0, 2.0, 3.0])
    prompt_buffer = int(cache.layers[0].keys.untyped_storage().data_ptr())  # type: ignore[union-attr]
    assert kv.adopt(cache)
    assert _buffer(kv) == prompt_buffer and _rows(kv) == [[1.0, 2.0, 3.0]]  # no copy
    assert not kv.adopt(_prefill_cache([7.0]))  # only an empty batch adopts
    _step(kv, [4.0])
    kv.add_states(_row([10.0, 11.0]), 1)  # the first growth makes room for the reserve ...
    buffer = _buffer(kv)
    for i in range(6):
        kv.add_states(_row([20.0 + i]), 1)  # ... so the next joins copy no row
    assert _buffer(kv) == buffer and kv.rows == 8
    _step(kv, [5.0] * 8)
    assert _rows(kv)[:3] == [[1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 11.0, 5.0], [20.0, 5.0]]
    assert kv.keep([1, 2]) == [2, 1] and _rows(kv) == [[20.0, 5.0], [10.0, 11.0, 5.0]]


def test_a_batch_does_not_adopt_a_cache_of_several_rows_or_another_dtype() -> None:
    two = BatchCache()
    keys = torch.ones(2, HEADS, 3, DIM)
    two.update(keys, keys, 0)
    assert not KVBatch().adopt(two)
    assert not KVBatch(torch.bfloat16).adopt(_prefill_cache([1.0, 2.0]))
    assert not KVBatch().adopt(BatchCache())  # no layers


def test_layers_a_forward_adds_keep_the_caches_dtype_and_reserve() -> None:
    # The model's forward adds a layer per update; a prefill's bfloat16 cache (--kv-cache-dtype
    # bfloat16 under a float32 model) must store bfloat16 from its first token, cold or not.
    cache = BatchCache(torch.bfloat16, reserve_rows=4)
    keys = torch.full((1, HEADS, 2, DIM), 1.0 + 2.0**-10)  # not a bfloat16 value
    for layer in range(2):
        stored, _ = cache.update(keys, -keys, layer)
        assert stored.dtype == torch.bfloat16 and torch.equal(stored, keys.to(torch.bfloat16))
    assert [type(layer) for layer in cache.layers] == [GrowableLayer, GrowableLayer]
    kv = KVBatch(torch.bfloat16, reserve_rows=4)
    assert kv.adopt(cache)  # a prefill in the batch's dtype joins without a copy
    buffer = _buffer(kv)
    for _ in range(3):
        kv.add_states(_row([5.0]), 1)
    _step(kv, [1.0] * 4)
    assert kv.rows == 4 and _buffer(kv) == buffer  # the first buffer had room for the reserve


def test_a_claimed_position_shows_in_the_views_read_after_it() -> None:
    # The one-call decode layers claim a position and write it themselves; the views are remade
    # when read, after any number of claims, and a reset is not undone by a stale view.
    layer = GrowableLayer()
    first = torch.arange(2 * HEADS * 4 * DIM, dtype=torch.float32).view(2, HEADS, 4, DIM)
    layer.set_states(first, -first)
    like = torch.empty(2, HEADS, 1, DIM)
    for written in (7.0, 8.0):
        keys, values, start, length = layer.append_position(like)
        keys[:2, :, start + length - 1] = written
        values[:2, :, start + length - 1] = -written
    assert layer.keys is not None and layer.values is not None
    assert layer.keys.shape == (2, HEADS, 6, DIM) and layer.get_seq_length() == 6
    assert torch.equal(layer.keys[:, :, :4], first) and torch.equal(layer.values[:, :, :4], -first)
    assert layer.keys[:, :, 4:, 0].unique().tolist() == [7.0, 8.0]
    assert layer.values[:, :, 5].unique().tolist() == [-8.0]
    layer.append_position(like)
    layer.reset()
    assert layer.keys is None and layer.values is None
