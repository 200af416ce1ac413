"""Start-up checks before tritonserver starts: each bad start prints one line that says what to do."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from openai_frontend.launcher import model_check, serve
from openai_frontend.launcher.cli import parse_serve_args
from openai_frontend.launcher.model_check import ModelFolder, ModelFolderError, check_device, check_model_folder
from openai_frontend.launcher.triton_install import TritonInstallError
from openai_frontend.launcher.triton_log import failure_summary
from tests.fixtures.tiny_models import remove_chat_template

# A real failed start of the wheel's tritonserver on a CPU machine, shortened.
FAILED_LOG = """\
W1201 10:36:37.770059 2609 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, pinned memory pool will not be available: CUDA driver version is insufficient"
E1201 10:36:37.770221 2609 server.cc:241] "CudaDriverHelper has not been initialized."
I1201 10:36:37.771638 2609 model_lifecycle.cc:472] "loading: triton_chat:1"
E1201 10:36:52.020739 2609 model_lifecycle.cc:642] "failed to load 'triton_chat' version 1: Internal: ValueError: the tokenizer has no chat_template\\n\\nAt:\\n  /x/loader.py(142): load_model\\n"
I1201 10:36:52.021060 2609 server.cc:674]
+-------------+---------+--------------------------------------------------+
| Model       | Version | Status                                           |
+-------------+---------+--------------------------------------------------+
| triton_chat | 1       | UNAVAILABLE: Internal: ValueError: the tokenizer |
+-------------+---------+--------------------------------------------------+

Error: Failed to initialize NVML
W1201 10:36:52.022171 2609 metrics.cc:798] "DCGM unable to start: DCGM initialization error"
error: creating server: Internal - failed to load all models
"""


def _model_files(folder: Path, source: Path, names: tuple[str, ...]) -> Path:
    folder.mkdir()
    for name in names:
        shutil.copy2(source / name, folder / name)
    return folder


@pytest.fixture
def complete_model(tmp_path: Path, tiny_model_dir: Path) -> Path:
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "complete"))


def test_a_complete_model_folder_passes(complete_model: Path) -> None:
    assert check_model_folder(ModelFolder(complete_model, "--model")) == complete_model.resolve()


@pytest.mark.parametrize(
    ("remove", "words"),
    [
        (("config.json",), "has no config.json"),
        (("model.safetensors",), "has no weights"),
        (("tokenizer.json",), "has no tokenizer"),
    ],
)
def test_a_model_folder_missing_a_part_names_it(complete_model: Path, remove: tuple[str, ...], words: str) -> None:
    for name in remove:
        (complete_model / name).unlink()
    with pytest.raises(ModelFolderError, match=words) as caught:
        check_model_folder(ModelFolder(complete_model, "--model"))
    assert "\n" not in str(caught.value) and str(complete_model) in str(caught.value)


def test_a_model_without_a_chat_template_says_to_use_the_instruct_model(complete_model: Path) -> None:
    remove_chat_template(complete_model)
    with pytest.raises(ModelFolderError, match="has no chat template; use the chat \\(Instruct\\)"):
        check_model_folder(ModelFolder(complete_model, "--model"))


def test_a_broken_config_json_is_named(complete_model: Path) -> None:
    (complete_model / "config.json").write_text("{nope")
    with pytest.raises(ModelFolderError, match="config.json cannot be read"):
        check_model_folder(ModelFolder(complete_model, "--model"))


def test_cuda_without_a_gpu_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_check, "NVIDIA_DEVICE", tmp_path / "nvidiactl")
    with pytest.raises(ModelFolderError, match="--device cuda:1: this machine has no NVIDIA GPU"):
        check_device("cuda:1")
    (tmp_path / "nvidiactl").touch()
    check_device("cuda:1")
    check_device("cpu")
    check_device("auto")


def test_npu_without_torch_npu_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_check.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelFolderError, match=r"torch_npu is not installed; install the ascend extra"):
        check_device("npu:0")


def test_a_bad_model_weight_path_names_the_config_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"ModelConfig": {"modelWeightPath": str(tmp_path / "nope")}}))
    options = replace(parse_serve_args(["serve", "--config", str(config)]), port=0)
    assert serve.run_serve(options) == 1
    assert f"{config} ModelConfig.modelWeightPath {tmp_path / 'nope'} is not a folder" in caplog.text
    assert "--model" not in caplog.text


def test_a_flag_given_on_the_command_line_is_named_as_the_flag(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"ModelConfig": {"modelWeightPath": str(tmp_path)}}))
    options = parse_serve_args(["serve", "--config", str(config), "--model", str(tmp_path), "--device", "cpu"])
    assert (options.model_origin, options.device_origin) == ("--model", "--device")
    assert parse_serve_args(["serve", "--config", str(config)]).model_origin.endswith("ModelConfig.modelWeightPath")


def test_a_bad_lora_path_in_the_config_names_the_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"LoraModules": [{"name": "sql", "path": str(tmp_path)}]}))
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "--config", str(config)])
    err = capsys.readouterr().err
    assert f"{config} LoraModules sql" in err and "--lora-module" not in err


def test_a_missing_tritonserver_is_reported_before_the_demo_conversion(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    conversions: list[Path] = []

    def no_tritonserver(cache: Path) -> None:
        raise TritonInstallError("tritonserver is not on PATH and the nvidia-pytriton wheel is not installed")

    monkeypatch.setattr(serve, "locate_tritonserver", no_tritonserver)

    def convert(cache: Path, progress: object) -> Path:
        conversions.append(cache)
        return cache

    monkeypatch.setattr(serve, "ensure_demo_model", convert)
    assert serve.run_serve(replace(parse_serve_args(["serve"]), port=0)) == 1
    assert conversions == []
    assert "tritonserver is not on PATH" in caplog.text


def test_a_failed_load_is_the_model_error_alone_without_nvml(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    log.write_text(FAILED_LOG)
    summary = failure_summary(log)
    assert summary == (
        "the model 'triton_chat' failed to load: Internal: ValueError: the tokenizer has no chat_template "
        f"(full log: {log})"
    )


def test_a_failure_without_a_load_error_shows_the_log_end_without_noise(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    log.write_text("Error: Failed to initialize NVML\nerror: creating server: Invalid argument - bad flag\n")
    summary = failure_summary(log)
    assert "bad flag" in summary and "NVML" not in summary
