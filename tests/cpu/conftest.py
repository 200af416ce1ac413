"""Fixtures of the CPU tests: the W8A8 int8 kernels (python_backend/cpu/int8_gemm.py, int8_rows.py),
built once per session, a test that needs one skipped where this machine cannot build it."""

from __future__ import annotations

import pytest

from python_backend.cpu.int8_gemm import Int8Gemm
from python_backend.cpu.int8_rows import Int8RowsKernel
from python_backend.cpu.quant_linear import Int8Paths


@pytest.fixture(scope="session")
def int8_paths() -> Int8Paths:
    """Both C paths of W8A8 products, as a model load builds them (either None where it cannot)."""
    return Int8Paths.build()


@pytest.fixture
def int8_gemm(int8_paths: Int8Paths) -> Int8Gemm:
    """Our int8 product (its AVX512-VNNI build, else its AVX2 one); skips without a C compiler or AVX2."""
    if int8_paths.gemm is None:
        pytest.skip("no C compiler or no AVX2 on this CPU: W8A8 layers use torch._int_mm")
    return int8_paths.gemm


@pytest.fixture
def int8_rows(int8_paths: Int8Paths) -> Int8RowsKernel:
    """The C row passes around torch._int_mm; skips without a C compiler."""
    if int8_paths.rows is None:
        pytest.skip("no C compiler: W8A8 layers keep PyTorch's passes")
    return int8_paths.rows
