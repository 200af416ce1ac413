"""The one-pass SiLU (python_backend/cpu/silu.py): PyTorch's SiLU up to its exp, ``silu_mul`` exactly
``silu(gate) * up`` as PyTorch rounds it, rows independent, and the model's MLPs given the kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_backend.cpu.silu import NativeSiLU, SiluKernel, build_silu_kernel
from tests.fixtures.engine_driver import load_on_cpu


@pytest.fixture(scope="module")
def silu() -> SiluKernel:
    kernel = build_silu_kernel()
    if kernel is None:
        pytest.skip("no C compiler or no AVX-512 on this CPU: models keep PyTorch's SiLU")
    return kernel


def test_silu_is_pytorchs_within_one_bfloat16_step(silu: SiluKernel) -> None:
    torch.manual_seed(0)
    x = (torch.randn(37, 1000) * 4).bfloat16()
    x[0, :3] = torch.tensor([-100.0, 100.0, 0.0])
    got, expected = silu.silu(x), torch.nn.functional.silu(x)
    # Only the exp differs (a few float32 ulp): a result may round to the neighbouring bfloat16.
    step = expected.float().abs() * torch.finfo(torch.bfloat16).eps + 1e-30
    assert ((got.float() - expected.float()).abs() <= step).all()
    assert (got != expected).float().mean() < 0.01
    assert got[0, :3].tolist() == [-0.0, 100.0, 0.0]


def test_silu_mul_is_silu_times_up_rounded_as_pytorch(silu: SiluKernel) -> None:
    torch.manual_seed(1)
    gate_up = (torch.randn(5, 2 * 777) * 3).bfloat16()  # a width that is no multiple of 16
    got = silu.silu_mul(gate_up)
    assert got.shape == (5, 777)
    assert torch.equal(got, silu.silu(gate_up[:, :777]) * gate_up[:, 777:])


def test_a_row_does_not_depend_on_the_rows_beside_it(silu: SiluKernel) -> None:
    torch.manual_seed(2)
    gate_up = (torch.randn(9, 2 * 100) * 3).bfloat16()
    together = silu.silu_mul(gate_up)
    for row in range(9):
        assert torch.equal(silu.silu_mul(gate_up[row : row + 1])[0], together[row])


def test_other_dtypes_keep_pytorchs_silu(silu: SiluKernel) -> None:
    x = torch.randn(4, 8)
    assert torch.equal(NativeSiLU(silu)(x), torch.nn.functional.silu(x))


def test_a_bfloat16_models_mlps_run_the_kernel(silu: SiluKernel, tiny_model_dir: Path) -> None:
    loaded = load_on_cpu(tiny_model_dir, "bfloat16")
    assert all(type(layer.mlp.act_fn) is NativeSiLU for layer in loaded.model.get_decoder().layers)
    wide = load_on_cpu(tiny_model_dir, "float32")
    assert not any(type(layer.mlp.act_fn) is NativeSiLU for layer in wide.model.get_decoder().layers)
