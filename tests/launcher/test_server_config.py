"""config.json: MindIE's keys become the serve command's defaults; flags override the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openai_frontend.launcher.cli import parse_serve_args
from openai_frontend.launcher.options import engine_settings


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_file_values_apply_and_flags_override(tmp_path: Path, tiny_model_dir: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    config = write(tmp_path, {
        "ServerConfig": {"port": 9100, "openAiSupport": "openai", "fullTextEnabled": True, "apiKeys": ["k1"],
                         "tokenTimeout": 5, "e2eTimeout": 120},
        "ModelConfig": {"modelName": "mine", "modelWeightPath": str(tiny_model_dir), "maxIterTimes": 77,
                        "maxSeqLen": 256, "maxBatchSize": 4, "dtype": "float32"},
        "LoraModules": [{"name": "sql", "path": str(adapter)}],
    })  # fmt: skip
    options = parse_serve_args(["serve", "--config", str(config), "--port", "9200", "--max-iter-times", "5"])
    assert options.port == 9200  # the flag wins
    assert options.openai_mode == "openai" and options.full_text and options.api_keys == ("k1",)
    assert (options.token_timeout_s, options.e2e_timeout_s) == (5, 120)
    assert options.served_model_name == "mine" and options.model == tiny_model_dir
    assert options.lora_modules == {"sql": str(adapter.resolve())}
    settings = engine_settings(options, tiny_model_dir, "mine")
    assert (settings.max_iter_times, settings.max_seq_len, settings.max_num_seqs, settings.dtype) == (
        5,
        256,
        4,
        "float32",
    )


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"ServerConfig": {"portt": 1}}, "ServerConfig.portt"),
        ({"ServerConfig": {"port": "8000"}}, "ServerConfig.port"),
        ({"ServerConfig": {"port": 70000}}, "ServerConfig.port"),
        ({"ModelConfig": {"maxIterTimes": 0}}, "ModelConfig.maxIterTimes"),
        ({"ServerConfig": {"tokenTimeout": 0}}, "ServerConfig.tokenTimeout"),
        ({"ServerConfig": {"e2eTimeout": "600"}}, "ServerConfig.e2eTimeout"),
        ({"Other": {}}, "Other"),
        ({"ServerConfig": {"httpsEnabled": True}}, "tlsCert"),
        ({"ModelConfig": {"dtype": "float64"}}, "dtype"),
    ],
)
def test_bad_files_are_start_up_errors_naming_the_key(tmp_path: Path, capsys, data: dict, words: str) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_serve_args(["serve", "--config", str(write(tmp_path, data))])
    assert caught.value.code == 2
    assert words in capsys.readouterr().err


def test_unreadable_or_broken_file(tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{nope")
    for path in (broken, tmp_path / "missing.json"):
        with pytest.raises(SystemExit):
            parse_serve_args(["serve", "--config", str(path)])
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "cannot read" in err
