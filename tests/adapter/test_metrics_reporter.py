"""The engine's gauges on Triton's /metrics: set before the model reports ready, then on a timer."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

from python_backend.engine.engine import Engine
from python_backend.triton.metrics import MetricsReporter


class _Metric:
    def __init__(self) -> None:
        self.values: list[float] = []

    def set(self, value: float) -> None:
        self.values.append(value)


class _Family:
    GAUGE, COUNTER = "gauge", "counter"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name
        self.metric = _Metric()

    def Metric(self, labels: dict[str, str]) -> _Metric:  # noqa: N802  (Triton's spelling)
        return self.metric


def _pb_utils() -> tuple[Any, dict[str, _Family]]:
    """A stand-in for Triton's ``pb_utils`` (its MetricFamily) and the families it made, by name."""
    families: dict[str, _Family] = {}

    class Family(_Family):
        def __init__(self, name: str, description: str, kind: str) -> None:
            super().__init__(name, description, kind)
            families[name] = self

    return SimpleNamespace(MetricFamily=Family), families


@dataclass
class _Stats:
    running_sequences: int = 0
    waiting_requests: int = 0
    kv_cache_bytes: int = 0
    kv_reserved_tokens: int = 0
    kv_budget_tokens: int = 14336
    prefix_cache_bytes: int = 0
    compute_threads: int = 2
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0


class _Engine:
    def stats(self) -> _Stats:
        return _Stats()


def test_the_budget_is_on_metrics_before_the_first_timer_tick() -> None:
    # A scrape right after readiness must see the budget, however fast the first request is.
    pb_utils, families = _pb_utils()
    reporter = MetricsReporter(cast(Engine, _Engine()), "tiny", pb_utils)
    try:
        assert families["triton_chat_kv_cache_budget_tokens"].metric.values == [14336.0]
        assert families["triton_chat_compute_threads"].metric.values == [2.0]
    finally:
        reporter.stop()
