"""The tensor-parallel settings: their checks, MindIE's config.json form and each rank's share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from openai_frontend.launcher.cli import parse_args, parse_serve_args
from openai_frontend.launcher.options import engine_settings
from openai_frontend.launcher.worker import WorkerOptions
from python_backend.model.shard import ShardError, check_shardable
from python_backend.parallel import group
from python_backend.parallel.group import rank_device, rank_settings
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


NODE_FLAGS = ["--nnodes", "2", "--master-addr", "10.231.0.1", "--master-port", "29500"]


def test_ranks_per_node_must_be_whole_and_the_flags_are_named() -> None:
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "-tp", "3", *NODE_FLAGS])
    with pytest.raises(
        SettingsError, match=r"tensor_parallel_size \(--tensor-parallel-size\) 3 .* nnodes \(--nnodes\) 2"
    ):
        EngineSettings(tensor_parallel_size=3, nnodes=2, master_addr="a", master_port=1)
    with pytest.raises(SettingsError, match=r"needs master_addr \(--master-addr\) and master_port \(--master-port\)"):
        EngineSettings(tensor_parallel_size=2, nnodes=2)
    with pytest.raises(SettingsError, match=r"node_rank \(--node-rank\) 2 must be below nnodes \(--nnodes\) 2"):
        EngineSettings(tensor_parallel_size=2, nnodes=2, node_rank=2, master_addr="a", master_port=1)
    # device_ids names the devices of one node: 4 ranks over 2 nodes take 2 each.
    with pytest.raises(SettingsError, match="2 ranks on each node"):
        EngineSettings(tensor_parallel_size=4, nnodes=2, master_addr="a", master_port=1, device_ids="0,1,2,3")


def test_each_node_counts_its_devices_from_its_own_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group, "resolve_device", torch.device)  # no GPU needed to name one
    settings = EngineSettings(
        device="cuda", tensor_parallel_size=16, nnodes=2, node_rank=1, master_addr="a", master_port=1
    )
    assert (settings.ranks_per_node, settings.first_rank) == (8, 8)
    assert [rank_device(settings, rank) for rank in (8, 9, 15)] == ["cuda:0", "cuda:1", "cuda:7"]
    cpu = EngineSettings(
        device="cpu", tensor_parallel_size=4, nnodes=2, master_addr="a", master_port=1, torch_threads=4
    )
    assert rank_settings(cpu, 3).torch_threads == 2  # its node's cores, over its node's 2 ranks


def test_the_node_flags_come_from_torchruns_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "10.231.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    options = parse_args(["worker", "-tp", "2"])
    assert isinstance(options, WorkerOptions)
    assert {k: options.values[k] for k in ("nnodes", "node_rank", "master_addr", "master_port")} == {
        "nnodes": 2,
        "node_rank": 1,
        "master_addr": "10.231.0.1",
        "master_port": 29500,
    }
    # A flag wins over the environment; serve --headless is the same worker.
    headless = parse_args(["serve", "--headless", "-tp", "4", "--node-rank", "1", "--master-port", "29600"])
    assert isinstance(headless, WorkerOptions) and headless.values["master_port"] == 29600
    monkeypatch.setenv("MASTER_PORT", "x")
    with pytest.raises(SystemExit):
        parse_args(["worker", "-tp", "2"])


def test_node_zero_serves_and_the_others_run_worker(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "-tp", "2", "--node-rank", "1", *NODE_FLAGS])
    assert "only node 0 serves; run `triton-chat worker`" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["worker", "-tp", "2", "--node-rank", "0", *NODE_FLAGS])
    assert "node 0 runs `triton-chat serve`" in capsys.readouterr().err
    settings = engine_settings(parse_serve_args(["serve", "-tp", "2", *NODE_FLAGS]), Path("/m"), "m")
    assert settings.to_parameters()["master_addr"] == "10.231.0.1"  # what config.pbtxt hands the model


def test_a_worker_refuses_lora_adapters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["worker", "-tp", "2", "--node-rank", "1", *NODE_FLAGS, "--lora-modules", f"a={tmp_path}"])
    assert "--lora-modules: a model over several nodes" in capsys.readouterr().err
