"""The tensor-parallel settings: their checks, MindIE's config.json form and each rank's share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openai_frontend.launcher.cli import parse_serve_args
from openai_frontend.launcher.options import engine_settings
from python_backend.model.shard import ShardError, check_shardable
from python_backend.parallel.group import rank_settings
from python_backend.protocol.settings import EngineSettings, SettingsError


def test_device_ids_must_name_one_device_per_rank() -> None:
    with pytest.raises(SettingsError, match="device_ids names 3 devices; tensor_parallel_size is 2"):
        EngineSettings(tensor_parallel_size=2, device_ids="0,1,2")
    with pytest.raises(SettingsError, match="comma-separated device indexes"):
        EngineSettings(tensor_parallel_size=2, device_ids="0,gpu1")
    assert EngineSettings(tensor_parallel_size=2, device_ids="4, 5").rank_device_ids == [4, 5]


def test_config_json_takes_mindie_world_size_and_nested_device_ids(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"ModelConfig": {"worldSize": 4, "npuDeviceIds": [[4, 5, 6, 7]], "device": "cpu"}}))
    options = parse_serve_args(["serve", "--config", str(path)])
    settings = engine_settings(options, tmp_path, "m")
    assert (settings.tensor_parallel_size, settings.device_ids) == (4, "4,5,6,7")


def test_the_flag_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"ModelConfig": {"worldSize": 4}}))
    options = parse_serve_args(["serve", "--config", str(path), "--tensor-parallel-size", "2"])
    assert engine_settings(options, tmp_path, "m").tensor_parallel_size == 2


def test_each_cpu_rank_gets_its_share_of_the_threads() -> None:
    settings = EngineSettings(device="cpu", tensor_parallel_size=2, torch_threads=4)
    ranks = [rank_settings(settings, rank) for rank in range(2)]
    assert [(r.device, r.torch_threads) for r in ranks] == [("cpu", 2), ("cpu", 2)]


def test_heads_that_do_not_divide_are_refused_before_loading() -> None:
    # SmolLM2-135M's heads: 9 attention, 3 key/value.
    config = {"num_attention_heads": 9, "num_key_value_heads": 3}
    with pytest.raises(ShardError, match="tensor_parallel_size 2 must divide both"):
        check_shardable(config, 2, text_model=True, adapters=0)
    with pytest.raises(ShardError, match="LoRA"):
        check_shardable(config, 3, text_model=True, adapters=1)
    with pytest.raises(ShardError, match="text chat models only"):
        check_shardable(config, 3, text_model=False, adapters=0)
