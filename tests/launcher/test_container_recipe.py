"""The README's NGC container recipe, checked without Docker: its blocks are parsed and each part is
held against what it relies on here (the checkout it mounts, the extra it installs, the repository
``triton-chat repository`` writes, the flags tritonserver has). docs/own-triton.md lists what this
verifies and what only a run inside the container could."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import tomllib
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from openai_frontend.launcher import own_triton
from openai_frontend.launcher.cache import cache_root
from openai_frontend.launcher.cli import parse_args
from openai_frontend.launcher.model_repo import MODEL_NAME, SHIM_IMPORT
from openai_frontend.launcher.options import RepositoryOptions
from openai_frontend.launcher.triton_access import version_problem
from openai_frontend.launcher.triton_install import TritonInstall, TritonInstallError, locate_tritonserver

REPO_ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Running the model repository under your own Triton"
IMAGE = re.compile(r"^nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-py3$")
# The first NGC release with the published shared-memory and HTTP fixes (version_problem's advice).
FIXED_RELEASE = (25, 7)


def recipe_blocks() -> list[list[list[str]]]:
    """The section's ``shell`` blocks, each as its commands split the way a shell splits them."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```shell\n(.*?)```", section, flags=re.DOTALL)
    return [[shlex.split(line) for line in block.splitlines() if line.strip()] for block in blocks]


def _docker_run() -> list[str]:
    (outside, _inside) = recipe_blocks()
    (command,) = outside
    return command


def _inside() -> list[list[str]]:
    return recipe_blocks()[1]


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_recipe_is_one_docker_command_then_install_repository_and_tritonserver() -> None:
    assert [command[:2] for command in recipe_blocks()[0]] == [["docker", "run"]]
    assert [command[:2] for command in _inside()] == [
        ["pip", "install"],
        ["triton-chat", "repository"],
        ["tritonserver", "--model-repository"],
    ]


def test_the_image_is_nvidias_triton_from_a_release_with_the_security_fixes() -> None:
    image = _docker_run()[-1]
    match = IMAGE.match(image)
    assert match, image
    assert (int(match[1]), int(match[2])) >= FIXED_RELEASE
    assert "NGC 25.07" in (version_problem("2.58.0") or "")


def test_the_checkout_is_mounted_where_the_commands_run_and_the_ports_are_the_hosts() -> None:
    argv = _docker_run()
    source, _, target = _option(argv, "-v").partition(":")
    assert source == "$PWD"  # the checkout, as the README says to run it from there
    assert _option(argv, "-w") == target  # so the install's "." is the mounted checkout
    assert _option(argv, "--net") == "host"  # tritonserver's 8000-8002 are the host's
    assert _option(argv, "--gpus") == "all"


def test_the_install_names_an_extra_of_this_checkout_that_brings_the_engine() -> None:
    pip = _inside()[0]
    assert "--break-system-packages" in pip  # the container's Python is the system's
    target = _option(pip, "-e")
    path, _, extras = target.partition("[")
    assert path == "."
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = extras.rstrip("]").split(",")
    optional = project["optional-dependencies"]
    assert set(wanted) <= set(optional)
    brought = {re.split(r"[<>=\[ ]", requirement)[0] for extra in wanted for requirement in optional[extra]}
    assert {"torch", "transformers"} <= brought


def test_pip_knows_the_install_flags() -> None:
    done = subprocess.run(
        ["python3", "-m", "pip", "install", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"no pip for python3 here: {done.stderr.strip()[-200:]}")
    assert "--break-system-packages" in done.stdout and "--editable" in done.stdout


def test_the_repository_command_writes_what_tritonserver_is_pointed_at(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository, tritonserver = _inside()[1], _inside()[2]
    options = parse_args(repository[1:])
    assert isinstance(options, RepositoryOptions)
    assert str(options.dest) == _option(tritonserver, "--model-repository")
    assert options.model is None  # the demo model; its conversion is tested apart
    # A stand-in for the demo conversion, which needs the demo package and takes tens of seconds.
    monkeypatch.setattr(own_triton, "ensure_demo_model", lambda cache, progress: tiny_model_dir)
    written = tmp_path / "models"
    assert own_triton.write_repository(replace(options, dest=written)) == tiny_model_dir

    model = written / MODEL_NAME
    config = text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.backend == "python"  # the container ships it in /opt/tritonserver/backends
    assert config.model_transaction_policy.decoupled
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    assert Path(parameters["model_path"]).is_absolute()
    shim = (model / "1" / "model.py").read_text(encoding="utf-8")
    # The stub imports the mounted checkout, the folder the editable install points at.
    assert f"_CODE = {str(REPO_ROOT)!r}" in shim and SHIM_IMPORT in shim


def test_tritonserver_and_triton_chat_tritonserver_run_the_same_command_in_the_container() -> None:
    args = _inside()[2][1:]
    container = TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), None)
    assert own_triton.tritonserver_command(container, args).argv == ["/opt/tritonserver/bin/tritonserver", *args]


def test_tritonserver_has_every_flag_the_recipe_passes() -> None:
    try:
        install = locate_tritonserver(cache_root())
    except TritonInstallError as exc:
        pytest.skip(f"no tritonserver here: {exc}")
    done = subprocess.run(
        [str(install.server), "--help"],
        capture_output=True,
        text=True,
        env=install.environment(),
        timeout=60,
        check=False,
    )
    usage = done.stdout + done.stderr
    flags = [arg for arg in _inside()[2][1:] if arg.startswith("--")]
    assert flags and all(flag in usage for flag in flags), usage[-2000:]
