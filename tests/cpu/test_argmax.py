"""The argmax kernel of greedy sampling (python_backend/cpu/argmax.py): PyTorch's indices, ties to
the first, every float edge case, and the rows PyTorch answers itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_backend.cpu.argmax import RowArgmax, build_row_argmax
from python_backend.sampling.sampler import sample
from tests.fixtures.engine_driver import load_on_cpu
from tests.sampling.test_sampler import row


@pytest.fixture(scope="module")
def argmax() -> RowArgmax:
    kernel = build_row_argmax()
    if kernel is None:
        pytest.skip("no C compiler")
    return kernel


def _torch(logits: torch.Tensor) -> list[int]:
    return torch.max(logits, dim=1).indices.tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "vocab"), [(1, 7), (3, 49152), (64, 1000), (5, 151936)])
def test_random_rows_give_torchs_indices(argmax: RowArgmax, dtype: torch.dtype, rows: int, vocab: int) -> None:
    generator = torch.Generator().manual_seed(rows * vocab)
    logits = (torch.randn(rows, vocab, generator=generator) * 8).to(dtype)
    assert argmax.first_max(logits) == _torch(logits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ties_signs_infinities_and_nans_are_torchs(argmax: RowArgmax, dtype: torch.dtype) -> None:
    inf, nan = float("inf"), float("nan")
    rows = [
        [1.0, 3.0, 3.0, 2.0],  # a tie: the first
        [-5.0, -1.0, -3.0, -1.0],  # all negative: the largest, the first of two
        [-0.0, 0.0, -1.0, 0.0],  # -0 equals +0: the first
        [-2.0, 0.0, -0.0, -3.0],
        [-inf, -inf, -inf, -inf],  # all -inf: the first
        [1.0, inf, 2.0, inf],
        [1.0, nan, 5.0, nan],  # a NaN is the maximum
        [-inf, -1e30, -1e-30, -2.0],
    ]
    logits = torch.tensor(rows).to(dtype)
    assert argmax.first_max(logits) == _torch(logits)
    # Rows further apart than their width (a slice of the step's logits), and a column view.
    wide = torch.zeros(len(rows), 9, dtype=dtype)
    wide[:, 2:6] = logits
    assert argmax.first_max(wide[:, 2:6]) == _torch(logits)
    assert argmax.first_max(logits.t().contiguous().t()) == _torch(logits)


def test_greedy_sampling_with_the_kernel_picks_the_same_tokens(argmax: RowArgmax) -> None:
    generator = torch.Generator().manual_seed(3)
    logits = (torch.randn(16, 5000, generator=generator) * 4).to(torch.bfloat16)
    greedy = [row(temperature=0.0) for _ in range(16)]
    # A row whose maximum is suppressed (EOS before min_tokens) is searched again without it.
    greedy[5] = row(temperature=0.0, suppress_ids=(int(logits[5].float().argmax()),))
    picked = [t.token_id for t in sample(logits, greedy, argmax.first_max)]
    assert picked == [t.token_id for t in sample(logits, greedy)]
    assert picked[5] != int(logits[5].float().argmax())


def test_a_cpu_model_loads_with_the_kernel_unless_native_kernels_are_off(
    argmax: RowArgmax, tiny_model_dir: Path
) -> None:
    assert load_on_cpu(tiny_model_dir, "bfloat16").row_argmax is not None
    assert load_on_cpu(tiny_model_dir, "bfloat16", cpu_native_attention=False).row_argmax is None
