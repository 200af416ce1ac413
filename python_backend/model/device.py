"""Device and dtype selection: CUDA, Ascend NPU or CPU.

Owns: resolving ``auto|cpu|cuda[:N]|npu[:N]`` and ``auto|bfloat16|float16|float32`` to torch
objects (``auto`` dtype on CPU also asks whether the CPU has bfloat16 kernels), what an
accelerator says about its free memory (the engine's automatic KV budget) and waiting for its
queued work (``synchronize``: kernels run asynchronously on CUDA and Ascend, so a
clock read after launching them measures nothing until the device is waited for). CUDA goes
through ``torch.cuda`` and Ascend through ``torch.npu``, the same calls on both. This is the only
module that imports ``torch_npu`` (it registers the ``npu`` device with torch as a side effect, so
it must be imported before any NPU tensor is made).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any

import torch

from python_backend.cpu.linear import onednn_has_bfloat16

logger = logging.getLogger(__name__)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class DeviceError(RuntimeError):
    """The requested device is not available on this machine."""


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype


def _npu_available() -> bool:
    try:
        importlib.import_module("torch_npu")
    except ImportError:
        return False
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA if present, else Ascend if ``torch_npu`` imports and sees a device, else CPU."""
    base = name.split(":", 1)[0]
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if _npu_available():
            return torch.device("npu", 0)
        return torch.device("cpu")
    if base == "cuda" and not torch.cuda.is_available():
        raise DeviceError("device 'cuda' was requested but torch sees no CUDA device")
    if base == "npu" and not _npu_available():
        raise DeviceError("device 'npu' was requested but torch_npu is not installed or sees no NPU")
    return torch.device(name)


def resolve_dtype(
    name: str, config_dtype: torch.dtype | str | None, device: torch.device, cpu_bfloat16: bool | None = None
) -> torch.dtype:
    """``auto``: the checkpoint's dtype; float32 when it names none.

    On CPU a float16 checkpoint runs in bfloat16: CPU float16 matmuls are slow or missing, and
    bfloat16 keeps the exponent range of the weights. A 16-bit checkpoint runs in float32 on a CPU
    without bfloat16 kernels (``cpu_bfloat16``; detected when None), where float32 is the faster.
    An explicit name is always taken as it is.
    """
    if name != "auto":
        dtype = _DTYPES[name]
        if device.type == "cpu" and dtype == torch.bfloat16 and not _bfloat16_kernels(cpu_bfloat16):
            logger.warning("dtype bfloat16 on a CPU without bfloat16 kernels: emulated, float32 is faster")
        return dtype
    if isinstance(config_dtype, str):
        config_dtype = _DTYPES.get(config_dtype)
    dtype = config_dtype if isinstance(config_dtype, torch.dtype) else torch.float32
    if device.type != "cpu" or dtype == torch.float32:
        return dtype
    if not _bfloat16_kernels(cpu_bfloat16):
        logger.info("%s checkpoint on a CPU without bfloat16 kernels (AVX2 only): running in float32", dtype)
        return torch.float32
    if dtype == torch.float16:
        logger.info("float16 checkpoint on CPU: running in bfloat16")
        return torch.bfloat16
    return dtype


def _bfloat16_kernels(known: bool | None) -> bool:
    # Without oneDNN's bfloat16 kernels (an AVX2-only CPU) the demo model served about 4x fewer
    # tokens/s in bfloat16 than in float32 (docs/performance.md).
    return onednn_has_bfloat16() if known is None else known


def place(device_name: str, dtype_name: str, config_dtype: torch.dtype | str | None) -> Placement:
    device = resolve_device(device_name)
    return Placement(device=device, dtype=resolve_dtype(dtype_name, config_dtype, device))


def _accelerator(device: torch.device) -> Any | None:
    """``torch.cuda`` or ``torch.npu`` for an accelerator device; None for the CPU."""
    if device.type == "cuda":
        return torch.cuda
    if device.type == "npu":
        return getattr(torch, "npu", None)
    return None


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` now (after the weights are loaded); None for the CPU."""
    accelerator = _accelerator(device)
    if accelerator is None:
        return None
    free, _total = accelerator.mem_get_info(device)
    return int(free)


def synchronize(device: torch.device) -> None:
    """Wait until the work queued on ``device`` has run (nothing to wait for on the CPU)."""
    accelerator = _accelerator(device)
    if accelerator is not None:
        accelerator.synchronize(device)
