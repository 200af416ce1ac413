"""The weights dtype checked against the device before tritonserver starts.

Owns ``check_dtype_name`` (a dtype string the engine knows, with the usual short spellings
pointed at theirs) and ``check_dtype`` (what ``auto`` resolves to for the model folder and device,
refused in one line where the device cannot run it: bfloat16 on an NVIDIA GPU older than Ampere;
a warning where it runs but slowly: float16 on the CPU). The launcher imports no torch, so the GPU
is asked through ``nvidia-smi``; when that cannot answer, the model's own load stays the check.
The resolution mirrors the model's (``python_backend/model/device.py``): ``auto`` is the
checkpoint's ``torch_dtype`` (float32 when it names none the engine runs), a float16
checkpoint runs in bfloat16 on the CPU, and a 16-bit one in float32 on a CPU without bfloat16
kernels (told here from ``/proc/cpuinfo``'s flags, where the model asks oneDNN).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openai_frontend.launcher.model_check import ASCEND_DEVICE, NVIDIA_DEVICE, ModelFolderError
from python_backend.protocol.settings import DTYPES

logger = logging.getLogger("openai_frontend.launcher")

AUTO = "auto"
# Names people write for the engine's dtypes (torch's aliases, the "fp"/"bf" short forms).
SPELLINGS = {
    "fp16": "float16",
    "half": "float16",
    "torch.float16": "float16",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "fp32": "float32",
    "float": "float32",
    "torch.float32": "float32",
}
# NVIDIA GPUs run bfloat16 natively from compute capability 8.0 (Ampere); older ones emulate or
# lack its kernels, so a bfloat16 model there is slow or fails inside its first request.
BF16_CAPABILITY = (8, 0)
NVIDIA_SMI_TIMEOUT_S = 10.0
CPUINFO = Path("/proc/cpuinfo")
# oneDNN's bfloat16 kernels on x86 need AVX-512 (BW, VL and DQ; AMX CPUs have them) or AVX-NE-CONVERT.
X86_BF16_FLAGS = ({"avx512bw", "avx512vl", "avx512dq"}, {"avx_ne_convert"})


@dataclass(frozen=True)
class Gpu:
    """What ``nvidia-smi`` says about one GPU."""

    name: str
    capability: tuple[int, int]


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype the model will run in and why (for the start-up log)."""

    dtype: str
    reason: str


def check_dtype_name(dtype: str, origin: str = "--dtype") -> None:
    """Fail in one line when ``dtype`` is not one the engine runs (a config.json value is not
    checked by the flag's choices)."""
    if dtype in DTYPES:
        return
    known = ", ".join(DTYPES)
    spelled = SPELLINGS.get(dtype.strip().lower())
    hint = f"write {spelled}" if spelled else f"use one of {known}"
    raise ModelFolderError(f"{origin} '{dtype}' is not a dtype the engine runs; {hint}")


def check_dtype(
    dtype: str,
    device: str,
    checkpoint_dtype: str | None,
    origin: str = "--dtype",
    gpu: Callable[[str], Gpu | None] | None = None,
    cpu_bfloat16: Callable[[], bool | None] | None = None,
) -> DtypeChoice:
    """What the model will run in on ``device``, or one line saying what to pass instead.

    ``checkpoint_dtype``: the folder's ``torch_dtype`` (``checkpoint_torch_dtype``); ``gpu``:
    how to ask about a CUDA device (default: ``nvidia-smi``); ``cpu_bfloat16``: whether this CPU
    has bfloat16 kernels, None where it cannot tell (default: ``cpu_has_bfloat16_kernels``).
    """
    check_dtype_name(dtype, origin)
    on_cpu = _runs_on_cpu(device)
    slow_bf16 = on_cpu and (cpu_bfloat16 or cpu_has_bfloat16_kernels)() is False
    if dtype == AUTO:
        chosen = checkpoint_dtype if checkpoint_dtype in DTYPES and checkpoint_dtype != AUTO else "float32"
        reason = f"{origin} auto: the checkpoint's torch_dtype {checkpoint_dtype or '(none)'}"
        if slow_bf16 and chosen in ("float16", "bfloat16"):
            chosen, reason = "float32", f"{reason}, in float32 on this CPU, which has no bfloat16 kernels"
        elif on_cpu and chosen == "float16":
            chosen, reason = "bfloat16", f"{reason}, in bfloat16 on the CPU"
    else:
        chosen, reason = dtype, origin
    if slow_bf16 and chosen == "bfloat16":
        logger.warning(
            "%s bfloat16 on a CPU without bfloat16 kernels (AVX2 only): every product is emulated; "
            "--dtype auto runs the model in float32 here, several times faster",
            origin,
        )
    if on_cpu and chosen == "float16":
        # Where bfloat16 is emulated too, auto's float32 is the faster choice.
        better = (
            "float32 (or auto, which runs a float16 checkpoint in float32 here)"
            if slow_bf16
            else "bfloat16 (or auto, which runs a float16 checkpoint in bfloat16 here)"
        )
        logger.warning(
            "%s float16 on the CPU: many CPU kernels are slow or missing in float16; pass --dtype %s",
            origin,
            better,
        )
    if chosen == "bfloat16" and device.split(":", 1)[0] == "cuda":
        problem = _bf16_problem(device, reason, gpu or nvidia_gpu)
        if problem is not None:
            raise ModelFolderError(problem)
    elif chosen == "bfloat16" and device == AUTO and NVIDIA_DEVICE.exists():
        # auto takes the GPU only when this torch build has CUDA, which only the model can tell.
        problem = _bf16_problem("cuda:0", reason, gpu or nvidia_gpu)
        if problem is not None:
            logger.warning("%s (if this torch has CUDA)", problem)
    return DtypeChoice(chosen, reason)


def checkpoint_torch_dtype(model_dir: Path) -> str | None:
    """The ``torch_dtype`` (or newer ``dtype``) a model folder's config.json names, as the model reads it."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # check_model_folder has already said what is wrong with the file
    if not isinstance(config, dict):
        return None
    value = config.get("torch_dtype") or config.get("dtype")
    return value if isinstance(value, str) else None


def nvidia_gpu(device: str) -> Gpu | None:
    """Name and compute capability of the GPU ``device`` (cuda or cuda:N) names; None when
    ``nvidia-smi`` is absent or does not answer."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    index = device.split(":", 1)[1] if ":" in device else "0"
    # CUDA numbers the visible devices; nvidia-smi numbers them all (and takes the UUIDs too).
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    if visible and index.isdigit() and int(index) < len(visible):
        index = visible[int(index)]
    command = [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader", "-i", index]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("nvidia-smi did not answer: %s", exc)
        return None
    if done.returncode != 0:
        logger.debug("nvidia-smi failed: %s", done.stderr.strip() or done.stdout.strip())
        return None
    lines = done.stdout.strip().splitlines()
    name, _, capability = lines[0].rpartition(",") if lines else ("", "", "")
    major, _, minor = capability.strip().partition(".")
    if not (major.isdigit() and minor.isdigit()):
        logger.debug("nvidia-smi gave no compute capability: %r", done.stdout)
        return None
    return Gpu(name.strip(), (int(major), int(minor)))


def cpu_has_bfloat16_kernels(cpuinfo: Path = CPUINFO) -> bool | None:
    """Whether this CPU has the instructions oneDNN's bfloat16 kernels need (x86: AVX-512 or
    AVX-NE-CONVERT; Arm: BF16), from ``/proc/cpuinfo``; None where that says nothing."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "flags":  # x86
            flags = set(value.split())
            return any(needed <= flags for needed in X86_BF16_FLAGS)
        if key == "features":  # Arm
            return "bf16" in value.split()
    return None


def _runs_on_cpu(device: str) -> bool:
    """Whether the model will run on the CPU: ``cpu``, or ``auto`` on a machine without a GPU or NPU."""
    if device == "cpu":
        return True
    return device == AUTO and not NVIDIA_DEVICE.exists() and not ASCEND_DEVICE.exists()


def _bf16_problem(device: str, reason: str, gpu: Callable[[str], Gpu | None]) -> str | None:
    """Why ``device`` cannot run bfloat16, or None when it can (or cannot be asked)."""
    found = gpu(device)
    if found is None or found.capability >= BF16_CAPABILITY:
        return None
    major, minor = found.capability
    return (
        f"bfloat16 ({reason}) on {device} ({found.name}, compute capability {major}.{minor}): "
        f"this GPU has no bfloat16 kernels (they need {BF16_CAPABILITY[0]}.{BF16_CAPABILITY[1]}, Ampere, "
        "or newer); pass --dtype float16, or --dtype float32 for full precision"
    )
