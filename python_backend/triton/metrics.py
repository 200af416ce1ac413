"""The engine's gauges on Triton's own ``/metrics``: running sequences, waiting requests, KV cache,
and the preparer's counters (requests refused at their preparation deadline, late results dropped).

Owns ``MetricsReporter``, a thread that copies ``Engine.stats()`` (and the preparer's
``PreparerStats``) into Triton custom metrics. It
runs beside the engine in the stub process (docs/design.md, "Departures": engine metrics live in
Triton's process, next to Triton's ``nv_inference_*``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from python_backend.engine.engine import Engine
from python_backend.intake.preparer import PreparerStats

logger = logging.getLogger("triton_chat")

_GAUGES = (
    ("triton_chat_num_sequences_running", "Sequences in the engine's running batch", "running_sequences"),
    ("triton_chat_num_requests_waiting", "Requests queued for admission", "waiting_requests"),
    ("triton_chat_kv_cache_bytes", "Bytes held by the running batch's KV cache", "kv_cache_bytes"),
    (
        "triton_chat_kv_cache_reserved_tokens",
        "KV-cache token slots reserved by admitted requests",
        "kv_reserved_tokens",
    ),
    ("triton_chat_kv_cache_budget_tokens", "KV-cache token slots the engine may reserve", "kv_budget_tokens"),
    ("triton_chat_prefix_cache_bytes", "Bytes held by cached prompt prefixes", "prefix_cache_bytes"),
    ("triton_chat_compute_threads", "Compute threads the engine's steps now run with", "compute_threads"),
    # Totals since the engine started (vLLM's counter names); accepted / draft is the acceptance rate.
    (
        "triton_chat_spec_decode_num_draft_tokens",
        "Draft tokens speculative decoding proposed and verified",
        "spec_decode_num_draft_tokens",
    ),
    (
        "triton_chat_spec_decode_num_accepted_tokens",
        "Draft tokens speculative decoding accepted",
        "spec_decode_num_accepted_tokens",
    ),
)
_COUNTERS = (
    (
        "triton_chat_prepare_timeouts_total",
        "Requests refused because their prompt was not prepared within prepare_timeout_s",
        "prepare_timeouts",
    ),
    (
        "triton_chat_late_preparations_total",
        "Preparations that finished after their request was refused, their result dropped",
        "late_preparations",
    ),
)
# Each gauge update is a round trip to tritonserver, on the cores the engine computes on: a value
# is sent only when it changed, and at most this often (Prometheus scrapes every 15 s or so).
_METRICS_PERIOD_S = 0.5


class MetricsReporter:
    """Engine gauges on Triton's own ``/metrics``, refreshed by a thread of their own.

    Reading stats is cheap, but each gauge update is IPC to the server, so it runs on a timer
    rather than in the step loop.
    """

    def __init__(
        self,
        engine: Engine,
        model: str,
        pb_utils: Any,
        instance: str = "",
        preparer: Callable[[], PreparerStats] | None = None,
    ) -> None:
        """``pb_utils``: Triton's ``triton_python_backend_utils``, which only ``python_backend.triton``
        imports (it exists only inside Triton's stub); ``instance``: Triton's model instance name, a
        label of its own so that each instance's engine (``instance_group`` count > 1) is a series;
        ``preparer``: the preparer's counts, exposed as counters."""
        self._engine = engine
        self._preparer = preparer
        self._families: list[Any] = []
        self._gauges: list[tuple[Any, str]] = []
        self._counters: list[tuple[Any, str]] = []
        labels = {"model": model, "instance": instance} if instance else {"model": model}
        for name, description, field in _GAUGES:
            family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.GAUGE)
            self._families.append(family)
            self._gauges.append((family.Metric(labels=labels), field))
        for name, description, field in _COUNTERS if preparer is not None else ():
            family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.COUNTER)
            self._families.append(family)
            self._counters.append((family.Metric(labels=labels), field))
        self._sent: dict[str, float] = {}  # the value each gauge was last set to
        self._counted: dict[str, int] = {}  # each counter's total so far
        # Once before the model is ready, so that a scrape right after readiness already sees the
        # budget (a fast first request could otherwise finish before the timer's first update).
        self._publish()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="triton-chat-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(_METRICS_PERIOD_S):
            self._publish()

    def _publish(self) -> None:
        stats = self._engine.stats()
        try:
            for gauge, field in self._gauges:
                value = float(getattr(stats, field))
                if self._sent.get(field) != value:
                    gauge.set(value)
                    self._sent[field] = value
            if self._preparer is not None:
                counts = self._preparer()
                for counter, field in self._counters:
                    total = int(getattr(counts, field))
                    if total != self._counted.get(field, 0):
                        counter.increment(total - self._counted.get(field, 0))
                        self._counted[field] = total
        except Exception:  # metrics are best effort; serving goes on
            logger.exception("updating metrics failed")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        # Triton requires metrics to go before their families.
        self._gauges.clear()
        self._counters.clear()
        self._families.clear()
