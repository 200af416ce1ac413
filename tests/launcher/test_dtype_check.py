"""The dtype check before tritonserver starts: what ``auto`` resolves to, and one line that says what
to pass where the device cannot run the dtype. GPUs are stand-ins (a fake ``nvidia-smi``, a
``Gpu`` answer): this machine has none."""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from openai_frontend.launcher import dtype_check, model_check, serve
from openai_frontend.launcher.cli import main, parse_serve_args
from openai_frontend.launcher.dtype_check import (
    DtypeChoice,
    Gpu,
    check_dtype,
    check_dtype_name,
    checkpoint_torch_dtype,
    cpu_has_bfloat16_kernels,
    nvidia_gpu,
)
from openai_frontend.launcher.model_check import ModelFolderError
from openai_frontend.launcher.triton_install import TritonInstallError

T4 = Gpu("Tesla T4", (7, 5))
A100 = Gpu("NVIDIA A100-SXM4-80GB", (8, 0))


def _no_gpu_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(model_check, "NVIDIA_DEVICE", tmp_path / "no-nvidiactl")
    monkeypatch.setattr(model_check, "ASCEND_DEVICE", tmp_path / "no-davinci")
    monkeypatch.setattr(dtype_check, "NVIDIA_DEVICE", tmp_path / "no-nvidiactl")
    monkeypatch.setattr(dtype_check, "ASCEND_DEVICE", tmp_path / "no-davinci")


def _a_gpu_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gpu: Gpu | None) -> None:
    (tmp_path / "nvidiactl").touch()
    monkeypatch.setattr(model_check, "NVIDIA_DEVICE", tmp_path / "nvidiactl")
    monkeypatch.setattr(dtype_check, "NVIDIA_DEVICE", tmp_path / "nvidiactl")
    monkeypatch.setattr(dtype_check, "nvidia_gpu", lambda device: gpu)


@pytest.mark.parametrize(
    ("given", "advice"),
    [("fp16", "write float16"), ("bf16", "write bfloat16"), ("int4", "use one of auto, bfloat16, float16, float32")],
)
def test_an_unknown_dtype_says_what_to_write(given: str, advice: str) -> None:
    with pytest.raises(ModelFolderError) as caught:
        check_dtype_name(given)
    assert str(caught.value) == f"--dtype '{given}' is not a dtype the engine runs; {advice}"


def test_an_unknown_dtype_in_config_json_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"ModelConfig": {"dtype": "fp16"}}))
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "--config", str(config)])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"{config} ModelConfig.dtype 'fp16' is not a dtype the engine runs; write float16")
    assert parse_serve_args(["serve", "--dtype", "float32"]).dtype_origin == "--dtype"


@pytest.mark.parametrize(
    ("checkpoint", "device", "runs"),
    [
        ("bfloat16", "cpu", "bfloat16"),
        ("float16", "cpu", "bfloat16"),  # the model runs a float16 checkpoint in bfloat16 on the CPU
        ("float32", "cpu", "float32"),
        (None, "cpu", "float32"),  # a config.json that names no dtype
        ("float64", "cpu", "float32"),  # one the engine does not run
        ("float16", "cuda:0", "float16"),  # an accelerator runs the checkpoint's own
    ],
)
def test_auto_resolves_as_the_model_does(
    checkpoint: str | None, device: str, runs: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _a_gpu_here(monkeypatch, tmp_path, A100)
    choice = check_dtype("auto", device, checkpoint, cpu_bfloat16=lambda: True)
    assert choice.dtype == runs
    assert choice.reason.startswith(f"--dtype auto: the checkpoint's torch_dtype {checkpoint or '(none)'}")


def test_auto_on_a_machine_without_an_accelerator_is_the_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_gpu_here(monkeypatch, tmp_path)
    assert check_dtype("auto", "auto", "float16", cpu_bfloat16=lambda: True).dtype == "bfloat16"


@pytest.mark.parametrize("checkpoint", ["bfloat16", "float16"])
def test_auto_on_a_cpu_without_bfloat16_kernels_is_float32(checkpoint: str) -> None:
    choice = check_dtype("auto", "cpu", checkpoint, cpu_bfloat16=lambda: False)
    assert choice == DtypeChoice(
        "float32",
        f"--dtype auto: the checkpoint's torch_dtype {checkpoint}, in float32 on this CPU, which has no bfloat16 kernels",
    )
    # Where /proc/cpuinfo says nothing, the checkpoint's dtype is what the start-up line names.
    assert check_dtype("auto", "cpu", "bfloat16", cpu_bfloat16=lambda: None).dtype == "bfloat16"


def test_bfloat16_asked_for_on_a_cpu_without_its_kernels_runs_but_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="openai_frontend.launcher"):
        assert check_dtype("bfloat16", "cpu", None, cpu_bfloat16=lambda: False) == DtypeChoice("bfloat16", "--dtype")
    (record,) = caplog.records
    assert record.getMessage().startswith("--dtype bfloat16 on a CPU without bfloat16 kernels")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="openai_frontend.launcher"):
        check_dtype("bfloat16", "cpu", None, cpu_bfloat16=lambda: True)
    assert not caplog.records


@pytest.mark.parametrize(
    ("cpuinfo", "has"),
    [
        ("processor\t: 0\nflags\t\t: fpu sse avx2 fma\n", False),
        ("flags\t\t: avx2 avx512f avx512dq avx512bw avx512vl amx_tile\n", True),
        ("flags\t\t: avx2 avx_vnni avx_ne_convert\n", True),
        ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", True),
        ("processor\t: 0\nFeatures\t: fp asimd crc32\n", False),
        ("processor\t: 0\n", None),
    ],
)
def test_cpu_bfloat16_kernels_from_cpuinfo(cpuinfo: str, has: bool | None, tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert cpu_has_bfloat16_kernels(path) is has
    assert cpu_has_bfloat16_kernels(tmp_path / "missing") is None


def test_bfloat16_on_a_gpu_older_than_ampere_says_to_pass_float16() -> None:
    with pytest.raises(ModelFolderError) as caught:
        check_dtype("bfloat16", "cuda:1", None, gpu=lambda device: T4)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("bfloat16 (--dtype) on cuda:1 (Tesla T4, compute capability 7.5)")
    assert message.endswith("pass --dtype float16, or --dtype float32 for full precision")
    assert check_dtype("bfloat16", "cuda:1", None, gpu=lambda device: A100) == DtypeChoice("bfloat16", "--dtype")
    # nvidia-smi could not answer: the model's own load stays the check.
    assert check_dtype("bfloat16", "cuda", None, gpu=lambda device: None).dtype == "bfloat16"


def test_auto_that_resolves_to_bfloat16_on_an_old_gpu_names_the_checkpoint() -> None:
    with pytest.raises(ModelFolderError, match=r"^bfloat16 \(--dtype auto: the checkpoint's torch_dtype bfloat16\)"):
        check_dtype("auto", "cuda", "bfloat16", gpu=lambda device: T4)
    assert check_dtype("auto", "cuda", "float16", gpu=lambda device: T4).dtype == "float16"


def test_device_auto_on_an_old_gpu_warns_since_torch_may_run_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _a_gpu_here(monkeypatch, tmp_path, T4)
    with caplog.at_level(logging.WARNING, logger="openai_frontend.launcher"):
        assert check_dtype("auto", "auto", "bfloat16").dtype == "bfloat16"
    assert [r.getMessage() for r in caplog.records] == [
        "bfloat16 (--dtype auto: the checkpoint's torch_dtype bfloat16) on cuda:0 (Tesla T4, compute capability "
        "7.5): this GPU has no bfloat16 kernels (they need 8.0, Ampere, or newer); pass --dtype float16, or "
        "--dtype float32 for full precision (if this torch has CUDA)"
    ]


def test_float16_on_the_cpu_runs_but_warns_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="openai_frontend.launcher"):
        assert check_dtype("float16", "cpu", "bfloat16", cpu_bfloat16=lambda: True) == DtypeChoice("float16", "--dtype")
    (record,) = caplog.records
    assert "\n" not in record.getMessage()
    assert record.getMessage().startswith("--dtype float16 on the CPU: many CPU kernels are slow or missing")
    assert "pass --dtype bfloat16" in record.getMessage()
    caplog.clear()
    # Where bfloat16 is emulated as well, the advice is float32.
    with caplog.at_level(logging.WARNING, logger="openai_frontend.launcher"):
        check_dtype("float16", "cpu", "bfloat16", cpu_bfloat16=lambda: False)
    (record,) = caplog.records
    assert "pass --dtype float32 (or auto, which runs a float16 checkpoint in float32 here)" in record.getMessage()


def test_the_checkpoint_dtype_is_read_as_the_model_reads_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert checkpoint_torch_dtype(tmp_path) == "float16"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))  # transformers 5's key
    assert checkpoint_torch_dtype(tmp_path) == "bfloat16"
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_torch_dtype(tmp_path) is None


def _fake_nvidia_smi(folder: Path, script: str) -> Path:
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return smi


def test_nvidia_smi_is_asked_for_the_visible_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = tmp_path / "asked"
    _fake_nvidia_smi(tmp_path / "bin", f'echo "$@" > {asked}\necho "Tesla T4, 7.5"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert nvidia_gpu("cuda:1") == T4
    assert asked.read_text().split() == ["--query-gpu=name,compute_cap", "--format=csv,noheader", "-i", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvidia_gpu("cuda") == T4
    assert asked.read_text().split()[-2:] == ["-i", "0"]


def test_an_nvidia_smi_that_cannot_answer_is_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(tmp_path / "bin", 'echo "Failed to initialize NVML: Driver/library version mismatch"\nexit 9\n')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert nvidia_gpu("cuda:0") is None
    _fake_nvidia_smi(tmp_path / "bin", 'echo "Tesla T4, [N/A]"\n')
    assert nvidia_gpu("cuda:0") is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert nvidia_gpu("cuda:0") is None


def test_serve_refuses_before_looking_for_tritonserver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _a_gpu_here(monkeypatch, tmp_path, T4)
    looked: list[Path] = []

    def locate(cache: Path) -> None:
        looked.append(cache)
        raise TritonInstallError("not reached")

    monkeypatch.setattr(serve, "locate_tritonserver", locate)
    options = parse_serve_args(["serve", "--dtype", "bfloat16", "--device", "cuda"])
    assert serve.run_serve(replace(options, port=0)) == 1
    assert looked == []
    assert "on cuda (Tesla T4, compute capability 7.5)" in caplog.text
    assert "pass --dtype float16" in caplog.text


def test_repository_refuses_before_writing(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _a_gpu_here(monkeypatch, tmp_path, T4)
    dest = tmp_path / "models"
    argv = ["repository", str(dest), "--model", str(tiny_model_dir), "--dtype", "bfloat16", "--device", "cuda:0"]
    assert main(argv) == 1
    assert "pass --dtype float16" in capsys.readouterr().err
    assert not dest.exists()
