"""The one-pass SiLU (python_backend/cpu/silu.py): PyTorch's SiLU up to its exp, ``silu_mul`` exactly
``silu(gate) * up`` as PyTorch rounds it, rows independent, for bfloat16 rows (AVX-512) and float32
ones (AVX2), and a model's MLPs given the kernel of its dtype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_backend.cpu.silu import NativeSiLU, SiluKernel, build_silu_kernel
from tests.fixtures.engine_driver import load_on_cpu

DTYPES = [torch.bfloat16, torch.float32]


def _kernel(dtype: torch.dtype) -> SiluKernel:
    kernel = build_silu_kernel(dtype)
    if kernel is None:
        pytest.skip(f"no C compiler, or no {dtype} build on this CPU: models keep PyTorch's SiLU")
    return kernel


@pytest.fixture(scope="module")
def silu() -> SiluKernel:
    return _kernel(torch.bfloat16)


@pytest.fixture(scope="module")
def silu_f32() -> SiluKernel:
    return _kernel(torch.float32)


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


def test_float32_silu_is_pytorchs_within_its_exps_ulps(silu_f32: SiluKernel) -> None:
    torch.manual_seed(0)
    x = torch.randn(37, 1003) * 6  # a width that is no multiple of 8
    x[0, :6] = torch.tensor([-100.0, 100.0, 0.0, float("inf"), float("-inf"), float("nan")])
    got, expected = silu_f32.silu(x), torch.nn.functional.silu(x)
    # Edges as PyTorch's: exp(100) overflows (-0), inf stays, -inf/inf and NaN are NaN.
    assert got[0, :5].tolist()[:4] == [-0.0, 100.0, 0.0, float("inf")] and got[0, 4:6].isnan().all()
    close = (got[:, 6:] - expected[:, 6:]).abs() <= 4 * torch.finfo(torch.float32).eps * expected[:, 6:].abs()
    assert close.all()
    # From -120 to 120: the whole range where exp is reduced, overflows or underflows.
    wide = torch.linspace(-120, 120, 24001)
    exact = torch.nn.functional.silu(wide.double())
    assert torch.allclose(silu_f32.silu(wide).double(), exact, rtol=4e-7, atol=1e-36)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_is_silu_times_up_rounded_as_pytorch(dtype: torch.dtype) -> None:
    kernel = _kernel(dtype)
    torch.manual_seed(1)
    gate_up = (torch.randn(5, 2 * 777) * 3).to(dtype)  # a width that is no multiple of 16
    got = kernel.silu_mul(gate_up)
    assert got.shape == (5, 777) and got.dtype == dtype
    assert torch.equal(got, kernel.silu(gate_up[:, :777]) * gate_up[:, 777:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_does_not_depend_on_the_rows_beside_it(dtype: torch.dtype) -> None:
    kernel = _kernel(dtype)
    torch.manual_seed(2)
    gate_up = (torch.randn(9, 2 * 100) * 3).to(dtype)
    together = kernel.silu_mul(gate_up)
    for row in range(9):
        assert torch.equal(kernel.silu_mul(gate_up[row : row + 1])[0], together[row])
    # A wide batch takes the kernel's threads: still each element on its own.
    wide = (torch.randn(40, 2 * 2000) * 3).to(dtype)
    assert torch.equal(kernel.silu_mul(wide)[17], kernel.silu_mul(wide[17:18])[0])


def test_other_dtypes_keep_pytorchs_silu() -> None:
    kernel = build_silu_kernel(torch.float32) or build_silu_kernel(torch.bfloat16)
    if kernel is None:
        pytest.skip("no SiLU kernel on this CPU")
    x = torch.randn(4, 8, dtype=torch.float16)
    assert torch.equal(NativeSiLU(kernel)(x), torch.nn.functional.silu(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_models_mlps_run_the_kernel_of_its_dtype(dtype: torch.dtype, tiny_model_dir: Path) -> None:
    name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    loaded = load_on_cpu(tiny_model_dir, name)
    acts = [layer.mlp.act_fn for layer in loaded.transformers_model.get_decoder().layers]
    if build_silu_kernel(dtype) is None or loaded.fast_decoder is None:
        # No kernel, or no lean step (bfloat16 without oneDNN's prepacking): PyTorch's SiLU.
        assert not any(type(act) is NativeSiLU for act in acts)
    else:
        assert all(type(act) is NativeSiLU for act in acts)
        x = torch.randn(3, 64).to(dtype)
        assert torch.equal(acts[0](x), _kernel(dtype).silu(x))
