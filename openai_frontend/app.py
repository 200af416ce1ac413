"""The FastAPI application factory.

Owns: ``create_app``: routes, error handlers, middlewares (metrics outermost, then drain, the API
key and the body size limit), and the backend's lifetime. A backend passed in (tests, embedding) belongs to the caller;
without one, a ``TritonBackend`` is created in the lifespan (inside the event loop, where grpc.aio
needs it) and closed on shutdown. ``media_network`` replaces the media fetcher's resolver and dialer
(tests); ``engine_metrics`` is the launcher's reader of Triton's ``/metrics``. Only ``/openapi.json`` is served as documentation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from openai_frontend.client.base import ChatBackend
from openai_frontend.client.triton import TritonBackend
from openai_frontend.http.auth import ApiKeyMiddleware
from openai_frontend.http.body_limit import BodySizeLimitMiddleware
from openai_frontend.http.drain import DrainMiddleware
from openai_frontend.http.errors import install_error_handlers
from openai_frontend.http.metrics import FrontendMetrics, MetricsMiddleware
from openai_frontend.media.loader import MediaLoader
from openai_frontend.media.net import Network
from openai_frontend.routes import chat, health, metrics, models
from openai_frontend.settings import FrontendSettings
from openai_frontend.state import FrontendState


def create_app(
    settings: FrontendSettings,
    backend: ChatBackend | None = None,
    *,
    media_network: Network | None = None,
    engine_metrics: Callable[[], str] | None = None,
) -> FastAPI:
    """An app serving ``settings``; with ``backend`` None it talks to Triton over gRPC.
    ``engine_metrics`` reads Triton's metrics text, for the engine's gauges on ``/metrics``."""
    observed = FrontendMetrics(
        settings.served_model_name, "vllm:" if settings.metrics_vllm_names else "", engine_metrics
    )
    media = MediaLoader(settings.media, media_network, on_fetch=observed.media_fetched)
    state = FrontendState(settings=settings, media=media, metrics=observed, backend=backend)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        created = TritonBackend.from_settings(settings) if state.backend is None else None
        if created is not None:
            state.backend = created
        try:
            yield
        finally:
            if created is not None:
                state.backend = None
                await created.close()

    app = FastAPI(
        title="triton-chat",
        description="OpenAI/MindIE-compatible chat completions on Triton Inference Server",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    app.state.frontend = state
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(models.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    # add_middleware wraps: the last added runs first, so the key check precedes any body read.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=settings.api_keys)
    # While draining, new inference requests get their 503 before anything else runs.
    app.add_middleware(DrainMiddleware, state=state.drain)
    # Outermost: it sees every chat request's status, the drain's and the key check's included.
    app.add_middleware(MetricsMiddleware, metrics=observed, draining=state.drain)
    return app
