"""What deploy/'s scrapers read from a pod's /metrics is there, with the meaning they expect.

The Inference Extension's endpoint picker (inference-pool.yaml) reads, per pod, the queue, the
running batch and the KV-cache use as gauges (the first series of each family, as a number:
waiting and running requests, usage as a fraction 0..1), and the LoRA adapters in use from the
labels of the newest series of an info gauge (served when the pods serve adapters, as by vLLM;
tests/frontend/test_lora_activity.py follows requests through it); the autoscaler (hpa.yaml) reads the
engine's waiting requests through the Prometheus adapter. Each is checked against the frontend's
real /metrics, built from the Deployment's own flags, with the engine's gauges read from a
stand-in for tritonserver's metrics endpoint in two states: idle, and with requests queued.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from openai_frontend.app import create_app
from openai_frontend.launcher.cli import parse_serve_args
from openai_frontend.launcher.options import http_settings
from openai_frontend.settings import FrontendSettings
from tests.deploy.manifests import the
from tests.frontend.frontend_fakes import FakeBackend

# tritonserver's /metrics for one model instance: the engine's gauges as the model writes them.
TRITON_METRICS = """\
# TYPE triton_chat_num_sequences_running gauge
triton_chat_num_sequences_running{{instance="triton_chat_0_0",model="triton_chat"}} {running}
# TYPE triton_chat_num_requests_waiting gauge
triton_chat_num_requests_waiting{{instance="triton_chat_0_0",model="triton_chat"}} {waiting}
# TYPE triton_chat_kv_cache_reserved_tokens gauge
triton_chat_kv_cache_reserved_tokens{{instance="triton_chat_0_0",model="triton_chat"}} {reserved}
# TYPE triton_chat_kv_cache_budget_tokens gauge
triton_chat_kv_cache_budget_tokens{{instance="triton_chat_0_0",model="triton_chat"}} 4096
"""
ADAPTER = "my-adapter"
IDLE = {"running": 0, "waiting": 0, "reserved": 0}
QUEUED = {"running": 3, "waiting": 7, "reserved": 3900}


def picker_names() -> dict[str, str]:
    """The metric each of the picker's figures is read from (inference-pool.yaml's config)."""
    config = yaml.safe_load(the("ConfigMap", "inference-pool.yaml").body["data"]["plugins.yaml"])
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    parameters = extractor["parameters"]
    (engine,) = [e for e in parameters["engineConfigs"] if e["name"] == parameters["defaultEngine"]]
    return {key: value for key, value in engine.items() if key.endswith("Spec") and value}


def _deployment_settings(adapters: Path | None) -> FrontendSettings:
    """The frontend settings of the Deployment's pods, with a LoRA adapter folder served when given."""
    container = the("Deployment", "triton-chat.yaml").body["spec"]["template"]["spec"]["containers"][0]
    extra = ["--lora-modules", f"{ADAPTER}={adapters}"] if adapters is not None else []
    options = parse_serve_args([*container["args"], *extra])
    return FrontendSettings(
        served_model_name=options.served_model_name or "my-model",
        lora_names=list(options.lora_modules),
        **http_settings(options),
    )


async def scrape(state: dict[str, int], adapters: Path | None = None) -> dict[str, Any]:
    """The pod's /metrics, parsed: family name -> family, with Triton's gauges in ``state``."""
    read: Callable[[], str] = lambda: TRITON_METRICS.format(**state)  # noqa: E731
    app = create_app(_deployment_settings(adapters), FakeBackend(), engine_metrics=read)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pod") as client:
        reply = await client.get("/metrics")
    assert reply.status_code == 200
    return {family.name: family for family in text_string_to_metric_families(reply.text)}


def picker_reads(families: dict[str, Any], name: str) -> float:
    """What the picker takes from a family: its first series, which must be a gauge."""
    family = families.get(name)
    assert family is not None, f"{name} is not served"
    assert family.type == "gauge", f"{name} is a {family.type}; the picker reads gauges"
    assert family.samples, f"{name} has no series"
    return float(family.samples[0].value)


def test_the_picker_reads_vllms_names_for_queue_batch_and_kv_cache() -> None:
    names = picker_names()
    assert names.keys() >= {"queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"}
    assert names["kvUsageSpec"] == "vllm:kv_cache_usage_perc"  # not the deprecated gpu_cache_usage_perc


async def test_every_figure_the_picker_reads_is_served_with_its_meaning() -> None:
    names = picker_names()
    idle, queued = await scrape(IDLE), await scrape(QUEUED)
    waiting, running, usage = names["queuedRequestsSpec"], names["runningRequestsSpec"], names["kvUsageSpec"]
    assert (picker_reads(idle, waiting), picker_reads(queued, waiting)) == (0, QUEUED["waiting"])
    assert (picker_reads(idle, running), picker_reads(queued, running)) == (0, QUEUED["running"])
    assert picker_reads(idle, usage) == 0
    assert 0 < picker_reads(queued, usage) <= 1
    assert picker_reads(queued, usage) == pytest.approx(QUEUED["reserved"] / 4096)


@pytest.fixture
def adapter_dir(tmp_path: Path) -> Path:
    (tmp_path / "adapter_config.json").write_text("{}", encoding="utf-8")
    return tmp_path


async def test_no_figure_the_picker_is_told_to_read_is_missing(adapter_dir: Path) -> None:
    # Every family the config names is one the pods serve (the LoRA one once they serve adapters).
    queued = await scrape(QUEUED, adapter_dir)
    for name in picker_names().values():
        picker_reads(queued, name)


async def test_the_picker_finds_the_lora_adapters_in_the_labels_it_reads(adapter_dir: Path) -> None:
    name = picker_names()["loraSpec"]
    assert name not in await scrape(IDLE)  # no adapter served, no family: as vLLM without LoRA
    before = time.time()
    family = (await scrape(IDLE, adapter_dir))[name]
    assert family.type == "gauge"
    (series,) = family.samples
    assert set(series.labels) == {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}
    assert int(series.labels["max_lora"]) == 1  # every adapter served fits one batch
    assert series.labels["running_lora_adapters"] == series.labels["waiting_lora_adapters"] == ""
    assert before <= series.value <= time.time()  # the newest series is the one the picker keeps


async def test_the_autoscaler_reads_the_engines_waiting_requests_by_their_served_name() -> None:
    queued = await scrape(QUEUED)
    # The gauge that follows tritonserver's waiting requests, found by its value, not its name.
    (served,) = [
        name
        for name, family in queued.items()
        if family.type == "gauge" and [s.value for s in family.samples] == [QUEUED["waiting"]]
    ]
    metric = the("HorizontalPodAutoscaler").body["spec"]["metrics"][0]
    assert metric["type"] == "Pods"
    # The Prometheus adapter's default rule exposes a gauge under its own name.
    assert metric["pods"]["metric"]["name"] == served
