"""The device layer on CUDA and Ascend without either: torch.cuda and torch.npu stood in for by
recording fakes, so the device strings, the dtype choice, the memory the KV budget is sized from
and the synchronisation points are the ones real hardware would get."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch

from python_backend.cpu.linear import onednn_has_bfloat16
from python_backend.engine import limits
from python_backend.model import device as device_layer
from python_backend.model.device import DeviceError, free_memory, place, resolve_device, resolve_dtype, synchronize

GIB = 1 << 30


@dataclass
class FakeAccelerator:
    """The calls of ``torch.cuda`` / ``torch.npu`` the device layer makes, recorded."""

    available: bool = True
    current: int = 0
    free_bytes: int = 10 * GIB
    synced: list[torch.device] = field(default_factory=list)
    asked: list[torch.device] = field(default_factory=list)

    def is_available(self) -> bool:
        return self.available

    def current_device(self) -> int:
        return self.current

    def mem_get_info(self, device: torch.device) -> tuple[int, int]:
        self.asked.append(device)
        return self.free_bytes, 80 * GIB

    def synchronize(self, device: torch.device) -> None:
        self.synced.append(device)


class NoNpu:
    """``torch.npu`` of a process whose device slot is named "npu" but that has no NPU."""

    def is_available(self) -> bool:
        return False

    def device_count(self) -> int:
        return 0

    # torch.manual_seed seeds every device module it knows of; with no NPU there is nothing to seed.
    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        del seed


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeAccelerator:
    fake = FakeAccelerator(current=1)
    for name in ("is_available", "current_device", "mem_get_info", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


@pytest.fixture
def npu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAccelerator]:
    """``torch_npu`` importable and ``torch.npu`` present, as after installing the ascend extra."""
    fake = FakeAccelerator(free_bytes=30 * GIB)
    # What importing torch_npu does first: torch's out-of-tree device slot becomes "npu". It
    # cannot be undone: torch.accelerator then takes "npu" as the accelerator for the rest of the
    # process and asks torch.npu how many devices it has (Adam does, in any later test).
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    previous = getattr(torch, "npu", None)
    torch.npu = fake  # type: ignore[attr-defined]
    try:
        yield fake
    finally:
        # So after the test torch.npu is one that sees no device, as with no NPU installed.
        torch.npu = previous if previous is not None else NoNpu()  # type: ignore[attr-defined]
        torch.get_device_module.cache_clear()


def test_auto_takes_cudas_current_device(cuda: FakeAccelerator) -> None:
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")


def test_cuda_asked_for_without_one_is_a_device_error(cuda: FakeAccelerator) -> None:
    cuda.available = False
    with pytest.raises(DeviceError, match="torch sees no CUDA device"):
        resolve_device("cuda")


def test_auto_takes_the_npu_when_torch_npu_sees_one(npu: FakeAccelerator) -> None:
    assert resolve_device("auto") == torch.device("npu", 0)
    assert resolve_device("npu:3") == torch.device("npu", 3)
    npu.available = False
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match="torch_npu is not installed or sees no NPU"):
        resolve_device("npu:0")


def test_npu_without_torch_npu_is_a_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # an import of it raises ImportError
    with pytest.raises(DeviceError, match="torch_npu"):
        resolve_device("npu")


@pytest.mark.parametrize("accelerator", ["cuda", "npu"])
def test_accelerators_keep_a_float16_checkpoint_in_float16(accelerator: str) -> None:
    # Only the CPU turns float16 into bfloat16; an accelerator runs the checkpoint's dtype.
    target = torch.device(accelerator, 0)
    assert resolve_dtype("auto", "float16", target) == torch.float16
    assert resolve_dtype("auto", torch.bfloat16, target) == torch.bfloat16
    assert resolve_dtype("auto", None, target) == torch.float32
    assert resolve_dtype("bfloat16", "float16", target) == torch.bfloat16
    assert resolve_dtype("auto", "float16", torch.device("cpu"), cpu_bfloat16=True) == torch.bfloat16


def test_a_cpu_without_bfloat16_kernels_runs_16_bit_checkpoints_in_float32(caplog: pytest.LogCaptureFixture) -> None:
    cpu = torch.device("cpu")
    for checkpoint in ("bfloat16", torch.bfloat16, "float16"):
        assert resolve_dtype("auto", checkpoint, cpu, cpu_bfloat16=False) == torch.float32
    assert resolve_dtype("auto", "bfloat16", cpu, cpu_bfloat16=True) == torch.bfloat16
    # An explicit dtype is taken as asked, with a warning that it is emulated.
    with caplog.at_level("WARNING"):
        assert resolve_dtype("bfloat16", "bfloat16", cpu, cpu_bfloat16=False) == torch.bfloat16
    assert "emulated" in caplog.text
    detected = onednn_has_bfloat16()
    assert resolve_dtype("auto", "bfloat16", cpu) == (torch.bfloat16 if detected else torch.float32)


def test_place_on_cuda(cuda: FakeAccelerator) -> None:
    placement = place("auto", "auto", "float16")
    assert (placement.device, placement.dtype) == (torch.device("cuda", 1), torch.float16)


def test_free_memory_is_asked_of_the_device_itself(cuda: FakeAccelerator, npu: FakeAccelerator) -> None:
    assert free_memory(torch.device("cuda", 1)) == 10 * GIB
    assert free_memory(torch.device("npu", 2)) == 30 * GIB
    assert cuda.asked == [torch.device("cuda", 1)] and npu.asked == [torch.device("npu", 2)]
    assert free_memory(torch.device("cpu")) is None


def test_the_automatic_kv_budget_is_half_the_free_accelerator_memory(
    cuda: FakeAccelerator, npu: FakeAccelerator
) -> None:
    assert limits._automatic_budget(torch.device("cuda", 0)) == 5 * GIB
    assert limits._automatic_budget(torch.device("npu", 0)) == 15 * GIB
    cpu_budget = limits._automatic_budget(torch.device("cpu"))
    assert 0 < cpu_budget <= 8 * GIB and cuda.asked == [torch.device("cuda", 0)]


def test_synchronize_waits_on_the_accelerator_and_is_free_on_the_cpu(
    cuda: FakeAccelerator, npu: FakeAccelerator
) -> None:
    synchronize(torch.device("cuda", 1))
    synchronize(torch.device("npu", 0))
    synchronize(torch.device("cpu"))
    assert cuda.synced == [torch.device("cuda", 1)] and npu.synced == [torch.device("npu", 0)]


def test_loading_waits_for_the_device_before_the_budget_is_sized(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: object
) -> None:
    """The synchronisation point of a load: after the weights went to the device, before the
    caller reads its free memory (on the CPU here, with the call recorded)."""
    from python_backend.model import loader
    from python_backend.protocol.settings import EngineSettings

    synced: list[torch.device] = []
    monkeypatch.setattr(loader, "synchronize", synced.append)
    loaded = loader.load_model(EngineSettings(model_path=str(tiny_model_dir), dtype="float32", device="cpu"))
    assert synced == [loaded.device]
    assert device_layer.free_memory(loaded.device) is None
