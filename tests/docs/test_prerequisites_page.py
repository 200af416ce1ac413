"""docs/prerequisites.md against the code and the installed packages it describes.

Where a row can be held to a source, it is: the Python range to the project's minimum and the
Python-backend stubs the installed tritonserver wheel ships, the glibc floor to that wheel's
platform tag, numpy < 2 to the declared dependency, the families with the CPU fast paths to the
decoder classes the code merges and steps itself, the multimodal model types to the loader's, a
GGUF-only folder to the launcher's folder check, and the pre-quantized formats the page calls
unsupported to a real load of a tiny checkpoint that declares them.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
from pathlib import Path

import pytest
import tomllib

from openai_frontend.launcher.model_check import ModelFolder, ModelFolderError, check_model_folder
from python_backend.cpu.fused_projections import merge_eligible_layer_types
from python_backend.model.loader import ModelLoadError, load_model
from python_backend.prompt.multimodal.processor import AUDIO_MODEL_TYPES, VISION_MODEL_TYPES
from python_backend.protocol.settings import EngineSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = REPO_ROOT / "docs" / "prerequisites.md"
PYTRITON = "nvidia-pytriton"
# The page's unsupported pre-quantized formats and the config that declares each (compressed-tensors
# folders load: tests/model/test_quantization.py).
QUANTIZED = {
    "GPTQ": {"quant_method": "gptq", "bits": 4},
    "AWQ": {"quant_method": "awq", "bits": 4},
    "bitsandbytes": {"quant_method": "bitsandbytes", "load_in_4bit": True},
}


def _text() -> str:
    return PAGE.read_text(encoding="utf-8")


def _section(title: str) -> str:
    return _text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _pytriton() -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(PYTRITON)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{PYTRITON} is not installed (a frontend-only install)")


def test_the_python_range_is_the_projects_minimum_to_the_newest_stub() -> None:
    found = re.search(r"\| Python \| (3\.\d+) to (3\.\d+)", _text())
    assert found, "the Python row says 'X to Y'"
    requires = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={found[1]}"
    stubs = {
        tuple(int(n) for n in Path(str(f)).parent.name.split("."))
        for f in _pytriton().files or []
        if "python_backend_stubs/" in str(f) and str(f).endswith("triton_python_backend_stub")
    }
    newest = ".".join(map(str, max(stubs)))
    assert found[2] == newest, f"the installed {PYTRITON} has stubs up to Python {newest}"


def test_the_glibc_floor_is_the_tritonserver_wheels() -> None:
    tags = [line for line in (_pytriton().read_text("WHEEL") or "").splitlines() if line.startswith("Tag:")]
    floors = {re.search(r"manylinux_(\d+)_(\d+)_", tag).groups() for tag in tags}  # type: ignore[union-attr]
    assert len(floors) == 1, tags
    ((major, minor),) = floors
    assert f"glibc {major}.{minor} or newer" in _text()
    assert f"`manylinux_{major}_{minor}`" in _text()


def test_numpy_below_2_is_what_the_project_declares() -> None:
    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (numpy,) = [d for d in dependencies if d.startswith("numpy")]
    assert "<2" in numpy and f"`{numpy}`" in _text()


def test_the_fast_path_families_are_the_classes_the_code_merges() -> None:
    models = _section("Models")
    listed = set(re.findall(r"`(\w+DecoderLayer)`", models))
    assert listed == {cls.__name__ for cls in merge_eligible_layer_types()}


def test_the_multimodal_model_types_are_the_loaders() -> None:
    models = _section("Models")
    listed = set(re.findall(r"`(qwen\w*_(?:vl|audio))`", models))
    assert listed == set(VISION_MODEL_TYPES | AUDIO_MODEL_TYPES)


def test_a_gguf_only_folder_is_refused(tmp_path: Path) -> None:
    assert "| GGUF | no |" in _section("Weight formats")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    (tmp_path / "model.Q4_1.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelFolderError, match="no weights"):
        check_model_folder(ModelFolder(tmp_path, "--model"))


@pytest.mark.parametrize("name", sorted(QUANTIZED))
def test_a_pre_quantized_checkpoint_the_page_calls_unsupported_does_not_load(
    name: str, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    row = next(line for line in _section("Weight formats").splitlines() if "pre-quantized" in line)
    assert name in row and row.split("|")[2].strip() == "no"
    config = QUANTIZED[name]
    assert "`quantization_config.quant_method`" in row
    folder = shutil.copytree(tiny_llama_dir, tmp_path / "model")
    declared = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**declared, "quantization_config": config}))
    with pytest.raises(ModelLoadError, match=f"quantization_config.quant_method '{config['quant_method']}'"):
        load_model(EngineSettings(model_path=str(folder), dtype="float32", device="cpu"))
