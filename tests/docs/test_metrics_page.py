"""docs/metrics.md against the metric definitions themselves.

The frontend's families come from a real ``FrontendMetrics`` registry, in both naming modes, with an
engine reader that hands it Triton's exposition of one model instance and a LoRA adapter served (so
the engine's gauges, the adapters' family and their labels are there too); the model's families from a real ``MetricsReporter`` over a stand-in
for Triton's ``pb_utils``. A family missing from the page, a row naming one that does not exist, or
a row whose vLLM name, type or labels differ from the code's fails here. The plain and the vLLM
name of one family are paired by what they share in the code: their help text and type.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client.metrics import MetricWrapperBase

from openai_frontend.http.metrics import FrontendMetrics
from python_backend.engine.engine import Engine
from python_backend.triton.metrics import MetricsReporter

PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
FRONTEND_SECTION = "## The frontend's `/metrics`"
TRITON_SECTION = "## The model's families on Triton's metrics endpoint"
VLLM_PREFIX = "vllm:"
# What the launcher's reader returns from Triton's /metrics for one model instance.
TRITON_TEXT = """\
triton_chat_num_sequences_running{model="m",instance="triton_chat_0"} 1
triton_chat_num_requests_waiting{model="m",instance="triton_chat_0"} 0
triton_chat_kv_cache_reserved_tokens{model="m",instance="triton_chat_0"} 10
triton_chat_kv_cache_budget_tokens{model="m",instance="triton_chat_0"} 100
"""
# Served adapters, so that the family of the adapters in use is there too.
LORA_ADAPTERS = ("sql-lora",)
_NAME = re.compile(r"`([a-z0-9_:]+)`")


@dataclass(frozen=True)
class Family:
    name: str  # as the exposition shows it (a counter with its _total)
    type: str
    labels: frozenset[str]
    help: str


def frontend_families(prefix: str) -> dict[str, Family]:
    """Every family the frontend's /metrics exposes with ``prefix``, by exposed name."""
    metrics = FrontendMetrics("m", prefix=prefix, engine_metrics=lambda: TRITON_TEXT, lora_adapters=LORA_ADAPTERS)
    declared = {w._name: w._labelnames for w in vars(metrics).values() if isinstance(w, MetricWrapperBase)}
    families = {}
    for metric in metrics.registry.collect():
        sampled = {key for sample in metric.samples for key in sample.labels if key != "le"}
        labels = frozenset(declared.get(metric.name, ())) | sampled
        name = f"{metric.name}_total" if metric.type == "counter" else metric.name
        families[name] = Family(name, metric.type, labels, metric.documentation)
    return families


class _Family:
    GAUGE, COUNTER = "gauge", "counter"

    def __init__(self, name: str, description: str, kind: str, made: list[Family]) -> None:
        self._made = made
        self._family = (name, kind, description)

    def Metric(self, labels: dict[str, str]) -> SimpleNamespace:  # noqa: N802  (Triton's spelling)
        name, kind, description = self._family
        self._made.append(Family(name, kind, frozenset(labels), description))
        return SimpleNamespace(set=lambda value: None, increment=lambda value: None)


class _Zeros:
    """Engine and preparer stats: every figure 0."""

    def __getattr__(self, name: str) -> int:
        return 0


class _Engine:
    def stats(self) -> _Zeros:
        return _Zeros()


def triton_families() -> dict[str, Family]:
    """Every family the model writes into Triton's /metrics, by name."""
    made: list[Family] = []

    class Recorded(_Family):
        def __init__(self, name: str, description: str, kind: str) -> None:
            super().__init__(name, description, kind, made)

    pb_utils = SimpleNamespace(MetricFamily=Recorded)
    reporter = MetricsReporter(cast(Engine, _Engine()), "m", pb_utils, "triton_chat_0", cast(Any, _Zeros))
    reporter.stop()
    return {f.name: f for f in made}


@dataclass(frozen=True)
class Row:
    names: list[str]  # the first column's
    vllm_names: list[str]  # the frontend table's second column; empty for Triton's
    type: str
    labels: frozenset[str]


def page_rows(section: str, with_vllm_column: bool) -> list[Row]:
    text = PAGE.read_text(encoding="utf-8").split(section, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| `"):
            continue
        if with_vllm_column:
            name, vllm, kind, labels = cells[:4]
        else:
            (name, kind, labels), vllm = cells[:3], ""
        rows.append(Row(_NAME.findall(name), _NAME.findall(vllm), kind, frozenset(_NAME.findall(labels))))
    return rows


def _frontend_rows() -> Iterator[Any]:
    plain = frontend_families("")
    for row in page_rows(FRONTEND_SECTION, with_vllm_column=True):
        (name,) = row.names
        if name in plain:
            yield pytest.param(row, plain[name], id=name)


def test_the_page_lists_every_frontend_family_and_no_other() -> None:
    listed = [name for row in page_rows(FRONTEND_SECTION, True) for name in row.names]
    assert sorted(listed) == sorted(frontend_families(""))


def test_the_page_lists_every_vllm_name_and_no_other() -> None:
    listed = [name for row in page_rows(FRONTEND_SECTION, True) for name in row.vllm_names]
    assert sorted(listed) == sorted(frontend_families(VLLM_PREFIX))


@pytest.mark.parametrize(("row", "family"), list(_frontend_rows()))
def test_a_frontend_row_matches_its_family(row: Row, family: Family) -> None:
    assert row.type == family.type
    assert row.labels == family.labels
    renamed = [
        f.name for f in frontend_families(VLLM_PREFIX).values() if (f.help, f.type) == (family.help, family.type)
    ]
    assert sorted(row.vllm_names) == sorted(renamed), f"{family.name} under --metrics-vllm-names is {renamed}"


def test_the_page_lists_every_triton_family_as_the_model_declares_it() -> None:
    declared = triton_families()
    rows = {row.names[0]: row for row in page_rows(TRITON_SECTION, with_vllm_column=False)}
    assert sorted(rows) == sorted(declared)
    for name, family in declared.items():
        assert (rows[name].type, rows[name].labels) == (family.type, family.labels), name


def test_the_definitions_read_are_the_real_ones() -> None:
    families = frontend_families("")
    assert {"prompt_tokens_total", "kv_cache_usage_perc", "lora_requests_info"} <= set(families)
    assert "triton_chat_kv_cache_budget_tokens" in triton_families()
