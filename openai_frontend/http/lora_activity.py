"""vLLM's ``lora_requests_info``: the LoRA adapters this server is busy with, for routers.

Owns ``LoraActivity``, a Prometheus collector over the generation requests in flight that named an
adapter (``model`` = the adapter's name), and ``LoraRequest``, one such request's place in it. A
request is *waiting* from its arrival until its first output (queued in the engine or in its
prefill), then *running* until it ends. Each scrape shows one series, as vLLM's engine writes it
at each step: labels ``running_lora_adapters`` and ``waiting_lora_adapters`` (the adapters with at
least one request in that state, comma-separated) and ``max_lora`` (adapters one batch can mix:
all those served, since every adapter is loaded at start), value the time of the reading, so a
reader that keeps several series (the Gateway API Inference Extension's endpoint picker) takes
the newest. Without adapters there is no family, as in vLLM without LoRA.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LABELS = ("max_lora", "waiting_lora_adapters", "running_lora_adapters")


class LoraActivity(Collector):
    """Requests in flight per adapter, waiting or running; read at each collection."""

    def __init__(self, name: str, adapters: Sequence[str]) -> None:
        self._name = name
        self._adapters = tuple(adapters)
        # The event loop changes the counts; /metrics renders in a worker thread.
        self._lock = threading.Lock()
        self._waiting: Counter[str] = Counter()
        self._running: Counter[str] = Counter()

    def arrived(self, adapter: str) -> LoraRequest:
        """A request for ``adapter`` arrived: it waits until ``LoraRequest.started``."""
        with self._lock:
            self._waiting[adapter] += 1
        return LoraRequest(self, adapter)

    def _to_running(self, adapter: str) -> None:
        with self._lock:
            self._waiting[adapter] -= 1
            self._running[adapter] += 1

    def _leave(self, adapter: str, running: bool) -> None:
        with self._lock:
            (self._running if running else self._waiting)[adapter] -= 1

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            waiting = [a for a in self._adapters if self._waiting[a] > 0]
            running = [a for a in self._adapters if self._running[a] > 0]
        family = GaugeMetricFamily(self._name, "Running stats on LoRA requests", labels=list(LABELS))
        family.add_metric([str(len(self._adapters)), ",".join(waiting), ",".join(running)], time.time())
        yield family


class LoraRequest:
    """One request's place in ``LoraActivity``; ``started`` and ``ended`` count once each."""

    def __init__(self, activity: LoraActivity, adapter: str) -> None:
        self._activity = activity
        self._adapter = adapter
        self._state = "waiting"

    def started(self) -> None:
        """Its first output: from waiting to running."""
        if self._state == "waiting":
            self._state = "running"
            self._activity._to_running(self._adapter)

    def ended(self) -> None:
        """Answered, failed or abandoned: no longer counted."""
        if self._state != "ended":
            self._activity._leave(self._adapter, running=self._state == "running")
            self._state = "ended"
