"""The packed weights' memory (python_backend/cpu/weight_arena.py): aligned, disjoint tensors that
keep their values and their mapping, in mappings advised for 2 MiB pages, which is where the int8
and bfloat16 kernels pack their weights."""

from __future__ import annotations

import gc
import mmap
import sys
from pathlib import Path

import pytest
import torch

from python_backend.cpu.bf16_gemm import build_bf16_gemm
from python_backend.cpu.int8_gemm import Int8Gemm
from python_backend.cpu.weight_arena import ALIGNMENT, HUGE_PAGE, WeightArena

_ADVISED = sys.platform == "linux" and hasattr(mmap, "MADV_HUGEPAGE")


def _mapping_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def _span(tensor: torch.Tensor) -> range:
    return range(tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size())


def test_tensors_are_aligned_disjoint_and_keep_their_values() -> None:
    arena = WeightArena(chunk_bytes=HUGE_PAGE)
    sizes = [(1, torch.int8), (100, torch.int8), (3000, torch.bfloat16), (7, torch.float32), (200_000, torch.int8)]
    tensors = [arena.empty(numel, dtype) for numel, dtype in sizes]
    for tensor, (numel, dtype) in zip(tensors, sizes, strict=True):
        assert tensor.shape == (numel,) and tensor.dtype == dtype
        assert tensor.data_ptr() % ALIGNMENT == 0
    spans = sorted((_span(tensor) for tensor in tensors), key=lambda span: span.start)
    assert all(a.stop <= b.start for a, b in zip(spans, spans[1:], strict=False))
    for index, tensor in enumerate(tensors):
        tensor.fill_(index + 1)
    for index, tensor in enumerate(tensors):
        assert bool((tensor == index + 1).all())


def test_a_tensor_outlives_its_arena() -> None:
    arena = WeightArena(chunk_bytes=HUGE_PAGE)
    small, large = arena.empty(1000, torch.int8), arena.empty(3 * HUGE_PAGE, torch.int8)
    small.fill_(3)
    large.fill_(-5)
    del arena
    gc.collect()
    assert bool((small == 3).all()) and bool((large == -5).all())


def test_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        WeightArena(chunk_bytes=HUGE_PAGE + 1)
    with pytest.raises(ValueError, match="numel"):
        WeightArena().empty(-1, torch.int8)
    assert WeightArena().empty(0, torch.bfloat16).numel() == 0


@pytest.mark.skipif(not _ADVISED, reason="madvise(MADV_HUGEPAGE) is Linux's")
def test_small_weights_share_an_advised_chunk_and_large_ones_get_their_own() -> None:
    arena = WeightArena(chunk_bytes=2 * HUGE_PAGE)
    first, second = arena.empty(1000, torch.int8), arena.empty(5000, torch.bfloat16)
    large = arena.empty(HUGE_PAGE + 1, torch.int8)  # over half a chunk: a mapping of its own
    # Shared: the second starts on the first line after the first.
    assert second.data_ptr() == first.data_ptr() + 1024
    # Every mapping's usable part starts on a 2 MiB page, the large one too.
    assert first.data_ptr() % HUGE_PAGE == 0 and large.data_ptr() % HUGE_PAGE == 0
    for tensor in (first, second, large):
        assert "hg" in _mapping_flags(tensor.data_ptr())  # advised for huge pages
    # A weight that no longer fits the chunk starts a new one.
    after = arena.empty(2 * HUGE_PAGE - 4096, torch.int8)
    assert after.data_ptr() % HUGE_PAGE == 0 and after.data_ptr() not in _span(first)


@pytest.mark.skipif(not _ADVISED, reason="madvise(MADV_HUGEPAGE) is Linux's")
def test_the_int8_kernel_packs_into_advised_memory(int8_gemm: Int8Gemm) -> None:
    packed = int8_gemm.pack(torch.ones(64, 128, dtype=torch.int8))
    assert "hg" in _mapping_flags(packed.packed.data_ptr())
    assert torch.equal(int8_gemm.pack(torch.ones(64, 128, dtype=torch.int8)).packed, packed.packed)


@pytest.mark.skipif(not _ADVISED, reason="madvise(MADV_HUGEPAGE) is Linux's")
def test_the_bfloat16_kernel_packs_into_advised_memory() -> None:
    kernel = build_bf16_gemm()
    if kernel is None:
        pytest.skip("no C compiler, no AVX512-BF16, or an AMX CPU (oneDNN's products are kept there)")
    weight = torch.randn(48, 64).to(torch.bfloat16)
    packed = kernel.pack(weight, None)
    assert "hg" in _mapping_flags(packed.packed.data_ptr())
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert torch.allclose(packed.product(x).float(), (x.float() @ weight.float().T), rtol=2e-2, atol=2e-2)
