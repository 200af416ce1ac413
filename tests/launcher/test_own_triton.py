"""``triton-chat repository`` and ``triton-chat tritonserver`` without a running server: the written
repository, the prepared command line and environment, and the generated model shim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from openai_frontend.launcher.cli import main, parse_args
from openai_frontend.launcher.model_repo import MODEL_NAME, instance_count, write_model_repository
from openai_frontend.launcher.options import RepositoryOptions, TritonServerArgs
from openai_frontend.launcher.own_triton import tritonserver_command, write_repository
from openai_frontend.launcher.triton_install import TritonInstall
from python_backend.protocol.settings import EngineSettings

REPO_ROOT = Path(__file__).resolve().parents[2]


def _config(repo: Path) -> model_config_pb2.ModelConfig:
    text = (repo / MODEL_NAME / "config.pbtxt").read_text()
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_tritonserver_arguments_pass_through_as_given() -> None:
    options = parse_args(["tritonserver", "--model-repository", "m", "--help", "--http-port", "1"])
    assert options == TritonServerArgs(["--model-repository", "m", "--help", "--http-port", "1"])


def test_the_tritonserver_command_adds_the_backend_folder_and_the_stubs_python() -> None:
    install = TritonInstall(Path("/x/bin/tritonserver"), Path("/x/backends"), {"LD_LIBRARY_PATH": "/x/libs"})
    command = tritonserver_command(install, ["--model-repository", "m"])
    assert command.argv == ["/x/bin/tritonserver", "--model-repository", "m", "--backend-directory", "/x/backends"]
    assert command.env["LD_LIBRARY_PATH"] == "/x/libs"
    assert command.env["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)
    # A backend folder of the user's own wins; a tritonserver on PATH keeps its built-in one.
    mine = tritonserver_command(install, ["--model-repository", "m", "--backend-directory=/mine"])
    assert mine.argv == ["/x/bin/tritonserver", "--model-repository", "m", "--backend-directory=/mine"]
    on_path = tritonserver_command(TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), None), ["-h"])
    assert on_path.argv == ["/opt/tritonserver/bin/tritonserver", "-h"]


def test_repository_writes_the_model_folder_and_the_engine_flags(tmp_path: Path, tiny_model_dir: Path) -> None:
    options = parse_args(
        ["repository", str(tmp_path / "models"), "--model", str(tiny_model_dir), "--dtype", "float32",
         "--max-num-seqs", "3", "--instances", "2"]
    )  # fmt: skip
    assert isinstance(options, RepositoryOptions)
    assert write_repository(options) == tiny_model_dir.resolve()
    config = _config(tmp_path / "models")
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    assert parameters["model_path"] == str(tiny_model_dir.resolve())
    assert parameters["served_model_name"] == tiny_model_dir.name
    assert (parameters["dtype"], parameters["max_num_seqs"]) == ("float32", "3")
    assert [(group.count, group.kind) for group in config.instance_group] == [
        (2, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]
    assert instance_count(tmp_path / "models") == 2


def test_repository_refuses_to_overwrite_and_says_so(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "models" / MODEL_NAME).mkdir(parents=True)
    assert main(["repository", str(tmp_path / "models"), "--model", str(tiny_model_dir)]) == 1
    assert f"{tmp_path / 'models' / MODEL_NAME} already exists" in capsys.readouterr().err


def test_repository_checks_the_model_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repository", str(tmp_path / "models"), "--model", str(tmp_path)]) == 1
    assert "has no config.json" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()


def test_the_generated_shim_imports_this_checkout_in_an_isolated_python(tmp_path: Path) -> None:
    repo = write_model_repository(tmp_path / "repo", EngineSettings(model_path="/m"))
    shim = (repo / MODEL_NAME / "1" / "model.py").read_text()
    probe = shim.replace(
        "from python_backend.triton.model import TritonPythonModel",
        "import python_backend; print(python_backend.__file__)",
    )
    # -I: as the backend stub runs it, PYTHONPATH ignored.
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert done.stdout.strip() == str(REPO_ROOT / "python_backend" / "__init__.py")
