"""The rotary table (``cpu/rotary_table.py``): the module's own values, for every shape."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from python_backend.cpu.rotary_table import ROTARY_BLOCK, TabulatedRotary, tabulable


def test_the_rotary_table_gives_the_modules_values_the_same_for_every_shape() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=4096))
    table = TabulatedRotary(rotary)
    x = torch.zeros(1, 1, 64)
    block = torch.arange(ROTARY_BLOCK, 2 * ROTARY_BLOCK)[None]
    for got, expected in zip(table(x, block), rotary(x, block), strict=True):
        assert torch.equal(got, expected)  # the very call the table makes for that block
    position = ROTARY_BLOCK + 37
    alone = table(x, torch.tensor([[position]]))
    for shape in [(1, 3), (5, 1), (2, 77)]:
        positions = torch.randint(0, 3 * ROTARY_BLOCK, shape)
        positions[-1, -1] = position
        for got, reference in zip(table(x, positions), alone, strict=True):
            assert got.shape == (*shape, 16)
            assert torch.equal(got[-1, -1], reference[0, 0])


def test_one_position_is_a_contiguous_row_of_the_modules_values() -> None:
    rotary = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=4096))
    table = TabulatedRotary(rotary)
    x = torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    for position in (0, 5, ROTARY_BLOCK - 1, ROTARY_BLOCK, 3 * ROTARY_BLOCK + 1):
        got = table(x, torch.tensor([[position]]))
        expected = rotary(x, torch.tensor([[position]]))
        for part, reference in zip(got, expected, strict=True):
            assert part.shape == (1, 1, 16) and part.dtype == torch.bfloat16 and part.is_contiguous()
            assert torch.equal(part, reference)


@pytest.mark.parametrize(
    ("rope", "expected"),
    [
        (None, True),
        ({"rope_type": "linear", "factor": 2.0}, True),
        ({"rope_type": "dynamic", "factor": 2.0}, False),
    ],
)
def test_only_rotary_embeddings_of_the_position_alone_are_tabulated(
    rope: dict[str, object] | None, expected: bool
) -> None:
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=256)
    if rope is not None:
        config.rope_parameters = {**(config.rope_parameters or {}), **rope}
    assert tabulable(LlamaRotaryEmbedding(config)) is expected


def test_the_table_grows_at_least_twofold_in_whole_blocks_of_the_modules_values() -> None:
    rotary = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=4096))
    table = TabulatedRotary(rotary)
    x = torch.zeros(1, 1, 64)
    assert table.table(x, 5)[0].shape[0] == ROTARY_BLOCK
    cos, sin = table.table(x, ROTARY_BLOCK + 1)  # one position past it: twice the rows
    assert cos.shape[0] == 2 * ROTARY_BLOCK
    cos, sin = table.table(x, 3 * ROTARY_BLOCK)
    assert cos.shape[0] == 4 * ROTARY_BLOCK
    expected = rotary(x, torch.arange(ROTARY_BLOCK, 2 * ROTARY_BLOCK)[None])  # the block as the table computed it
    assert torch.equal(cos[ROTARY_BLOCK : 2 * ROTARY_BLOCK], expected[0][0])
    assert torch.equal(sin[ROTARY_BLOCK : 2 * ROTARY_BLOCK], expected[1][0])
