"""Prometheus metrics of the HTTP frontend, served at ``GET /metrics``.

Owns: ``FrontendMetrics`` (one registry per app, never prometheus_client's process-wide default,
so two apps in one process count apart), ``ChatObservation`` (what one chat request's answer
adds: time to first token, inter-token latency, end-to-end latency, queue time, tokens, finish
reasons, prefix-cache queries and hits, a failure or cancellation seen after the response
started), the backend's state (``backend_state``: up or down, and the outages counted) and
``MetricsMiddleware`` (requests running, and what the HTTP status of a chat request
says: failures, cancellations, rejections). Names follow vLLM's and MindIE's dashboards without
vLLM's ``vllm:`` prefix, or with it (``prefix="vllm:"``, so vLLM's Grafana dashboards work as they
are); every family has the ``model_name`` label. The engine's own gauges (running and waiting
sequences, KV-cache usage) are read from Triton's ``/metrics`` when the launcher hands in a
reader (``engine_metrics.EngineCollector``); the LoRA adapters in use, when adapters are served, by
``lora_activity.LoraActivity``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_frontend.http.cancellation import CLIENT_CLOSED_REQUEST
from openai_frontend.http.drain import DrainState
from openai_frontend.http.engine_metrics import EngineCollector
from openai_frontend.http.lora_activity import LoraActivity, LoraRequest
from python_backend.protocol.contract import ChoiceDelta, ChoiceUsage

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
# Statuses of requests refused before any work, and the reason label each gets.
REJECTIONS = {401: "unauthorized", 413: "too_large", 429: "overloaded"}

# vLLM's buckets (seconds) for token latencies and request latencies.
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
_BYTES_BUCKETS = tuple(float(2**n) for n in range(10, 30, 2))  # 1 KiB .. 128 MiB


@dataclass
class _InFlight:
    """What ``MetricsMiddleware`` ends when a generation request's ASGI call returns, whatever the
    path it took: its place among the LoRA adapters' requests, once the route named one."""

    lora: LoraRequest | None = None


# The generation request the middleware is answering, for the observation the route makes inside
# it: a context variable is per request (each ASGI call runs in a context of its own).
_IN_FLIGHT: ContextVar[_InFlight | None] = ContextVar("triton_chat_in_flight", default=None)


class FrontendMetrics:
    """Every metric family of one frontend; ``render`` is the exposition text."""

    def __init__(
        self,
        model_name: str,
        prefix: str = "",
        engine_metrics: Callable[[], str] | None = None,
        lora_adapters: Sequence[str] = (),
    ) -> None:
        """``prefix``: before every name (``vllm:`` for vLLM's dashboards); ``engine_metrics``: reads
        Triton's ``/metrics``, whose engine gauges each scrape re-exposes (None: none);
        ``lora_adapters``: the adapters served, whose requests ``lora_requests_info`` shows."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        labels = ["model_name"]
        r = self.registry
        p = prefix
        # With vLLM's names, num_requests_running is the engine's batch (as in vLLM); HTTP
        # requests in flight keep a name of their own.
        running_name = f"{p}num_http_requests_running" if p else "num_requests_running"
        self.running = Gauge(running_name, "Chat requests the frontend is answering", labels, registry=r)
        self.ttft = Histogram(
            f"{p}time_to_first_token_seconds", "Request arrival to first streamed token", labels,
            buckets=_TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            f"{p}inter_token_latency_seconds", "Time between a stream's responses", labels,
            buckets=_TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            f"{p}e2e_request_latency_seconds", "Request arrival to its last byte, successful requests", labels,
            buckets=_REQUEST_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            f"{p}request_queue_time_seconds", "Time a choice waited in the engine's queue before its first step",
            labels, buckets=_REQUEST_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(f"{p}prompt_tokens", "Prompt tokens of answered requests", labels, registry=r)
        self.generation_tokens = Counter(
            f"{p}generation_tokens", "Tokens generated for answered choices", labels, registry=r
        )
        self.success = Counter(
            f"{p}request_success", "Choices that finished, by finish reason", [*labels, "finished_reason"], registry=r
        )
        self.failure = Counter(
            f"{p}request_failure", "Requests that ended with an error, by HTTP status", [*labels, "status"], registry=r
        )
        self.cancelled = Counter(f"{p}requests_cancelled", "Requests whose client went away", labels, registry=r)
        self.rejected = Counter(
            f"{p}requests_rejected", "Requests refused before any work, by reason", [*labels, "reason"], registry=r
        )
        self.media_fetches = Counter(
            f"{p}media_fetch", "Remote media fetches, by result (ok or the error code)", [*labels, "result"], registry=r
        )
        self.media_bytes = Histogram(
            f"{p}media_fetch_bytes",
            "Bytes of each remote media item fetched",
            labels,
            buckets=_BYTES_BUCKETS,
            registry=r,
        )
        self.prefix_cache_queries = Counter(
            f"{p}prefix_cache_queries", "Prompt tokens looked up in the prefix cache", labels, registry=r
        )
        self.prefix_cache_hits = Counter(
            f"{p}prefix_cache_hits", "Prompt tokens served from the prefix cache", labels, registry=r
        )
        # The engine reserves a request's KV cache when admitting it, so it never preempts; the
        # family is there (at 0) for dashboards that chart it. Refusals are requests_rejected.
        self.preemptions = Counter(f"{p}num_preemptions", "Requests preempted by the engine", labels, registry=r)
        self.preemptions.labels(model_name)
        # 1 until the backend's health says otherwise (``client.health``): it starts up.
        self.backend_up = Gauge(
            f"{p}backend_up", "1 while tritonserver answers the frontend's probes, else 0", labels, registry=r
        )
        self.backend_up.labels(model_name).set(1)
        self.backend_outages = Counter(
            f"{p}backend_outages", "Times tritonserver stopped answering the frontend's probes", labels, registry=r
        )
        self.backend_outages.labels(model_name)
        if engine_metrics is not None:
            r.register(EngineCollector(engine_metrics, model_name, prefix))
        self.lora = LoraActivity(f"{p}lora_requests_info", lora_adapters) if lora_adapters else None
        if self.lora is not None:
            r.register(self.lora)
        # The children observed per streamed token, looked up once (labels() costs a lock and a dict).
        self.ttft_child = self.ttft.labels(model_name)
        self.itl_child = self.itl.labels(model_name)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe(self, started: float) -> ChatObservation:
        """What one chat request's answer adds, timed from ``started`` (``time.monotonic()``)."""
        return ChatObservation(self, started, _IN_FLIGHT.get())

    def backend_state(self, up: bool) -> None:
        """The backend's health changed (``client.health``): down counts one outage."""
        self.backend_up.labels(self.model_name).set(1 if up else 0)
        if not up:
            self.backend_outages.labels(self.model_name).inc()

    def media_fetched(self, result: str, size: int) -> None:
        """One remote media fetch: ``ok`` with its size, or the failure's code (size 0)."""
        self.media_fetches.labels(self.model_name, result).inc()
        if result == "ok":
            self.media_bytes.labels(self.model_name).observe(size)


class ChatObservation:
    """The answer of one chat request as metrics see it; the routes and ``serving`` feed it."""

    def __init__(self, metrics: FrontendMetrics, started: float, in_flight: _InFlight | None = None) -> None:
        self._metrics = metrics
        self._started = started
        self._in_flight = in_flight
        self._lora_waiting: LoraRequest | None = None  # until the first output
        self._last_response: float | None = None
        self._prompt_counted = False
        self._ended = False

    def for_adapter(self, adapter: str | None) -> None:
        """The request names LoRA adapter ``adapter`` (None: the base model)."""
        lora, in_flight = self._metrics.lora, self._in_flight
        if adapter and lora is not None and in_flight is not None and in_flight.lora is None:
            in_flight.lora = self._lora_waiting = lora.arrived(adapter)

    def on_delta(self, delta: ChoiceDelta, streamed: bool) -> None:
        """A response from the model; a streamed one with something to show times TTFT / ITL."""
        m = self._metrics
        if self._lora_waiting is not None:
            self._lora_waiting.started()
            self._lora_waiting = None
        if streamed and (delta.text or delta.reasoning or delta.tool_calls or delta.finish_reason):
            now = time.monotonic()
            if self._last_response is None:
                m.ttft_child.observe(now - self._started)
            else:
                m.itl_child.observe(now - self._last_response)
            self._last_response = now
        if delta.finish_reason is not None:
            m.success.labels(m.model_name, delta.finish_reason).inc()
            if delta.usage is not None:
                self._count_usage(delta.usage)

    def _count_usage(self, usage: ChoiceUsage) -> None:
        m, name = self._metrics, self._metrics.model_name
        if not self._prompt_counted:  # the prompt is shared by the request's n choices
            m.prompt_tokens.labels(name).inc(usage.prompt_tokens)
            m.prefix_cache_queries.labels(name).inc(usage.prompt_tokens)
            m.prefix_cache_hits.labels(name).inc(usage.cached_tokens)
            self._prompt_counted = True
        m.generation_tokens.labels(name).inc(usage.completion_tokens)
        if usage.queue_wait_time:
            m.queue_time.labels(name).observe(usage.queue_wait_time[0] / 1e6)

    def succeeded(self) -> None:
        """The whole answer went out."""
        if not self._ended:
            self._ended = True
            self._metrics.e2e.labels(self._metrics.model_name).observe(time.monotonic() - self._started)

    def failed_in_stream(self, status: int) -> None:
        """A stream that had started ended with an error event (its HTTP status was 200)."""
        if not self._ended:
            self._ended = True
            self._metrics.failure.labels(self._metrics.model_name, str(status)).inc()

    def cancelled_in_stream(self) -> None:
        """A stream's client went away before its end."""
        if not self._ended:
            self._ended = True
            self._metrics.cancelled.labels(self._metrics.model_name).inc()


class MetricsMiddleware:
    """Chat requests running, and what a chat request's HTTP status says about it.

    A status other than 200 is a failure (by status), a cancellation (499, the client left) or,
    for 401, 413, 429 and a 503 while draining, also a rejection. What happens after a stream's
    200 is ``ChatObservation``'s to record.
    """

    def __init__(self, app: ASGIApp, metrics: FrontendMetrics, draining: DrainState) -> None:
        self.app = app
        self._metrics = metrics
        self._draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in GENERATION_PATHS or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        m, name = self._metrics, self._metrics.model_name
        statuses: list[int] = []
        draining_at_start = self._draining.draining

        async def send_observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                statuses.append(int(message["status"]))
            await send(message)

        m.running.labels(name).inc()
        in_flight = _InFlight()
        entered = _IN_FLIGHT.set(in_flight)
        try:
            await self.app(scope, receive, send_observed)
        except Exception:
            # Starlette's outermost middleware turns what escapes here into its 500, after us.
            if not statuses:
                statuses.append(500)
            raise
        finally:
            m.running.labels(name).dec()
            if in_flight.lora is not None:
                in_flight.lora.ended()
            _IN_FLIGHT.reset(entered)
            if statuses and statuses[0] != 200:
                self._count_status(statuses[0], draining_at_start)

    def _count_status(self, status: int, draining: bool) -> None:
        m, name = self._metrics, self._metrics.model_name
        if status == CLIENT_CLOSED_REQUEST:
            m.cancelled.labels(name).inc()
            return
        m.failure.labels(name, str(status)).inc()
        reason = "draining" if status == 503 and draining else REJECTIONS.get(status)
        if reason is not None:
            m.rejected.labels(name, reason).inc()
