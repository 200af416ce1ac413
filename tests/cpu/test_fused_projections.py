"""Merged projections: bit-identical to the separate products, never a stale slice."""

from __future__ import annotations

import pytest
import torch

from python_backend.cpu.fused_projections import FusedProjections, ProjectionSlice
from python_backend.cpu.linear import prepack_supported
from tests.fixtures.onednn import PACKED_DTYPES

pytestmark = pytest.mark.skipif(
    not prepack_supported(torch.device("cpu"), torch.float32), reason="this torch build has no oneDNN linear"
)


def projections(dtype: torch.dtype, bias: bool) -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    return [torch.nn.Linear(64, width, bias=bias).to(dtype) for width in (64, 16, 16)]


@pytest.mark.parametrize("dtype", PACKED_DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 16, 200])
def test_each_part_equals_its_own_projection(dtype: torch.dtype, rows: int) -> None:
    linears = projections(dtype, bias=True)
    group = FusedProjections(linears)
    slices = [ProjectionSlice(group, i) for i in range(3)]
    x = torch.randn(1, rows, 64).to(dtype)
    with torch.inference_mode():
        # The plain products through oneDNN with the same weights, one at a time.
        expected = [FusedProjections([linear]).apply_unchecked(x) for linear in linears]
        got = [s(x) for s in slices]
    for part, reference, linear in zip(got, expected, linears, strict=True):
        assert part.shape == (1, rows, linear.out_features)
        assert torch.equal(part, reference)
        torch.testing.assert_close(part.float(), linear(x).float(), rtol=2e-2, atol=2e-2)


def test_a_part_of_another_input_is_computed_afresh() -> None:
    linears = projections(torch.float32, bias=False)
    group = FusedProjections(linears)
    q, k, v = (ProjectionSlice(group, i) for i in range(3))
    first, second = torch.randn(2, 64), torch.randn(2, 64)
    with torch.inference_mode():
        q(first)
        k_second = k(second)  # not the merged product of `first`
        v_second = v(second)
    torch.testing.assert_close(k_second, linears[1](second), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_second, linears[2](second), rtol=1e-5, atol=1e-5)


def test_the_merged_product_is_released_once_every_part_was_taken() -> None:
    group = FusedProjections(projections(torch.float32, bias=False))
    parts = [ProjectionSlice(group, i) for i in range(3)]
    x = torch.randn(3, 64)
    with torch.inference_mode():
        parts[0](x)
        parts[1](x)
        assert group._memo is not None
        parts[2](x)
    assert group._memo is None


def test_a_part_refuses_another_dtype() -> None:
    part = ProjectionSlice(FusedProjections(projections(torch.float32, bias=False)), 0)
    with pytest.raises(TypeError, match="expects torch.float32"):
        part(torch.randn(1, 64, dtype=torch.bfloat16))
