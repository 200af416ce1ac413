"""The engine's figures on the frontend's ``/metrics``, read from tritonserver's metrics endpoint.

Owns ``EngineCollector``: a Prometheus collector that, at each scrape of the frontend, reads the
model's custom metrics (``triton_chat_*``, written by the model into Triton's ``/metrics``; the
read itself is the launcher's, handed in, since serving modules open no connections) and
re-exposes them under the frontend's names and label scheme (``model_name``, plus ``instance``
when Triton runs several model instances): running sequences, waiting requests and the KV-cache
usage as a fraction. So one scrape target, whose address is known before start, has everything;
Triton's own port may be random. A failed read is a ``engine_metrics_up`` of 0, never a failed
scrape: the frontend's own figures still count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

TRITON_PREFIX = "triton_chat_"
# Triton's label for the model; the frontend's families use vLLM's ``model_name``.
TRITON_MODEL_LABEL = "model"


@dataclass(frozen=True)
class EngineNames:
    """The exposed family names: plain, or vLLM's for its dashboards (``--metrics-vllm-names``)."""

    running: str
    waiting: str
    kv_usage: tuple[str, ...]  # vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc; both for it
    up: str

    @classmethod
    def for_prefix(cls, prefix: str) -> EngineNames:
        if prefix:
            return cls(
                running=f"{prefix}num_requests_running",
                waiting=f"{prefix}num_requests_waiting",
                kv_usage=(f"{prefix}kv_cache_usage_perc", f"{prefix}gpu_cache_usage_perc"),
                up=f"{prefix}engine_metrics_up",
            )
        # Without a prefix the frontend's own num_requests_running (HTTP requests) keeps its name.
        return cls("num_sequences_running", "num_requests_waiting", ("kv_cache_usage_perc",), "engine_metrics_up")


@dataclass(frozen=True)
class _Sample:
    labels: tuple[tuple[str, str], ...]  # the frontend's labels of one engine (model instance)
    value: float


class EngineCollector(Collector):
    """Engine gauges from ``read`` (Triton's ``/metrics`` exposition text) at each collection."""

    def __init__(self, read: Callable[[], str], model_name: str, prefix: str = "") -> None:
        """``read`` raises ``OSError`` or ``ValueError`` when Triton cannot be read."""
        self._read_text = read
        self._model_name = model_name
        self._names = EngineNames.for_prefix(prefix)

    def describe(self) -> Iterator[Metric]:
        # Nothing up front: the registry would otherwise collect, i.e. read Triton, when registering.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        names = self._names
        up = GaugeMetricFamily(names.up, "1 when the engine's figures were read from Triton", labels=["model_name"])
        try:
            engine = self._read()
        except (OSError, ValueError) as exc:
            logger.warning("reading the engine's metrics from Triton failed: %s", exc)
            up.add_metric([self._model_name], 0.0)
            yield up
            return
        up.add_metric([self._model_name], 1.0)
        yield up
        yield self._gauge(names.running, "Sequences in the engine's running batch", engine.get("num_sequences_running"))
        yield self._gauge(
            names.waiting, "Requests queued in the engine for admission", engine.get("num_requests_waiting")
        )
        for name in names.kv_usage:
            yield self._gauge(name, "KV-cache use: reserved token slots over the budget (0-1)", _usage(engine))

    def _gauge(self, name: str, documentation: str, samples: list[_Sample] | None) -> GaugeMetricFamily:
        samples = samples or []
        label_names = [key for key, _ in samples[0].labels] if samples else ["model_name"]
        family = GaugeMetricFamily(name, documentation, labels=label_names)
        for sample in samples:
            family.add_metric([value for _, value in sample.labels], sample.value)
        return family

    def _read(self) -> dict[str, list[_Sample]]:
        """Triton's ``triton_chat_*`` samples by name without the prefix, relabelled."""
        text = self._read_text()
        found: dict[str, list[_Sample]] = {}
        for family in text_string_to_metric_families(text):
            if not family.name.startswith(TRITON_PREFIX):
                continue
            for sample in family.samples:
                found.setdefault(sample.name.removeprefix(TRITON_PREFIX), []).append(
                    _Sample(self._labels(sample.labels), float(sample.value))
                )
        return found

    def _labels(self, triton_labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
        # The frontend's served name, not Triton's label value: the two targets' series then join.
        rest = sorted((key, value) for key, value in triton_labels.items() if key != TRITON_MODEL_LABEL)
        return (("model_name", self._model_name), *rest)


def _usage(engine: dict[str, list[_Sample]]) -> list[_Sample]:
    """Reserved KV slots over the budget, per engine; an engine with no budget reported is left out."""
    budgets = {s.labels: s.value for s in engine.get("kv_cache_budget_tokens", [])}
    usage = []
    for sample in engine.get("kv_cache_reserved_tokens", []):
        budget = budgets.get(sample.labels)
        if budget:
            usage.append(_Sample(sample.labels, min(1.0, sample.value / budget)))
    return usage
