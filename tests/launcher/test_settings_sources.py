"""Each setting is declared once: its flag and config.json key come from that declaration."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from openai_frontend.launcher.cli import main, parse_serve_args
from openai_frontend.launcher.http_flags import frontend_flags
from openai_frontend.launcher.options import engine_settings
from openai_frontend.launcher.server_config import ModelSection, ServerSection
from python_backend.protocol.settings import EngineSettings, setting_info, setting_kind


def test_serve_help_lists_every_setting_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    flags = [setting_info(spec).flag for spec in fields(EngineSettings)] + [
        info.flag for _, _, info in frontend_flags()
    ]
    missing = [flag for flag in flags if flag and flag not in shown]
    assert not missing
    assert len([flag for flag in flags if flag]) == 69  # 50 engine settings, 19 frontend ones


def test_every_model_config_key_reaches_the_engine_settings(tmp_path: Path, tiny_model_dir: Path) -> None:
    model_config: dict[str, object] = {}
    expected: dict[str, object] = {}
    for spec in fields(EngineSettings):
        info = setting_info(spec)
        if info.mindie_key is None or spec.name == "model_path":
            continue
        kind = setting_kind(spec)
        if kind == "int":
            assert isinstance(spec.default, int)
            value: object = spec.default + 3
        elif kind == "bool":
            value = not spec.default
        elif info.choices:
            value = info.choices[-1]
        else:
            value = {"served_model_name": "mine", "device": "cpu", "device_ids": "0,1,2,3"}[spec.name]
        model_config[info.mindie_key] = value
        expected[spec.name] = value
    model_config["modelWeightPath"] = str(tiny_model_dir)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"ModelConfig": model_config}))
    options = parse_serve_args(["serve", "--config", str(path)])
    settings = engine_settings(options, tiny_model_dir, "mine")
    assert {name: getattr(settings, name) for name in expected} == expected
    assert options.model == tiny_model_dir


def test_example_config_has_every_key_at_its_default() -> None:
    example = json.loads((Path(__file__).resolve().parents[2] / "examples" / "config.json").read_text())
    server, model = ServerSection(), ModelSection()
    assert set(example["ServerConfig"]) == set(ServerSection.model_fields)
    assert example["ServerConfig"] == server.model_dump()
    assert set(example["ModelConfig"]) == set(ModelSection.model_fields)
    # The folder and its served name have no default; the example shows where they go.
    placeholders = {"modelName", "modelWeightPath"}
    assert {k: v for k, v in example["ModelConfig"].items() if k not in placeholders} == {
        k: v for k, v in model.model_dump().items() if k not in placeholders
    }
