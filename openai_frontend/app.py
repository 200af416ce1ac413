"""The FastAPI application factory.

Owns: ``create_app``: routes, error handlers, middlewares (the request id outermost, then CORS
when configured, metrics, drain, the API key and the body size limit), and the backend's
lifetime. A backend passed in (tests, embedding) belongs to the caller; without one, a
``TritonBackend`` is created in the lifespan (inside the event loop, where grpc.aio needs it) and
closed on shutdown, for at most ``BACKEND_CLOSE_S``. ``media_network`` replaces the media
fetcher's resolver and dialer (tests); ``docs_assets`` is the folder of Swagger UI's files for
``/docs`` (default: the installed ``swagger-ui-bundle``'s); ``engine_metrics`` is the launcher's
reader of Triton's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from openai_frontend.chat.schemas import ChatCompletionRequest
from openai_frontend.client.base import ChatBackend
from openai_frontend.client.triton import TritonBackend
from openai_frontend.completions.schemas import CompletionRequest
from openai_frontend.http.auth import ApiKeyMiddleware
from openai_frontend.http.body_limit import BodySizeLimitMiddleware
from openai_frontend.http.drain import DrainMiddleware
from openai_frontend.http.errors import install_error_handlers
from openai_frontend.http.metrics import FrontendMetrics, MetricsMiddleware
from openai_frontend.http.openapi import install_openapi
from openai_frontend.http.request_id import REQUEST_ID_HEADER, RequestIdMiddleware
from openai_frontend.media.loader import MediaLoader
from openai_frontend.media.net import Network
from openai_frontend.routes import chat, completions, health, load, metrics, models, tokenize, version
from openai_frontend.routes.docs import docs_router, swagger_assets
from openai_frontend.settings import FrontendSettings
from openai_frontend.state import FrontendState

# The shutdown's wait for the Triton client's close (milliseconds, a few seconds when tritonserver
# does not answer the channels' close): past it the process stops without it, since a stop that
# never ends is worse than an unclean close. Part of the stop that deploy/'s grace periods cover.
BACKEND_CLOSE_S = 5.0

logger = logging.getLogger(__name__)


def create_app(
    settings: FrontendSettings,
    backend: ChatBackend | None = None,
    *,
    media_network: Network | None = None,
    docs_assets: Path | None = None,
    engine_metrics: Callable[[], str] | None = None,
) -> FastAPI:
    """An app serving ``settings``; with ``backend`` None it talks to Triton over gRPC.
    ``engine_metrics`` reads Triton's metrics text, for the engine's gauges on ``/metrics``."""
    observed = FrontendMetrics(
        settings.served_model_name, "vllm:" if settings.metrics_vllm_names else "", engine_metrics, settings.lora_names
    )
    media = MediaLoader(settings.media, media_network, on_fetch=observed.media_fetched)
    state = FrontendState(settings=settings, media=media, metrics=observed, backend=backend)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        created = TritonBackend.from_settings(settings, observed.backend_state) if state.backend is None else None
        if created is not None:
            state.backend = created
        try:
            yield
        finally:
            if created is not None:
                state.backend = None
                await _close_within(created, BACKEND_CLOSE_S)

    app = FastAPI(
        title="triton-chat",
        description="OpenAI/MindIE-compatible chat completions and completions on Triton Inference Server",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    app.state.frontend = state
    install_error_handlers(app)
    install_openapi(app, request_models=(ChatCompletionRequest, CompletionRequest))
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(models.router)
    app.include_router(health.router)
    app.include_router(load.router)
    app.include_router(metrics.router)
    app.include_router(tokenize.router)
    app.include_router(version.router)
    app.include_router(docs_router(docs_assets or swagger_assets(), app.openapi_url or "", app.title))
    # add_middleware wraps: the last added runs first, so the key check precedes any body read.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    if settings.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=settings.api_keys)
    # While draining, new inference requests get their 503 before anything else runs.
    app.add_middleware(DrainMiddleware, state=state.drain)
    # Outside drain and the key check: it sees every chat request's status, theirs included.
    app.add_middleware(MetricsMiddleware, metrics=observed, draining=state.drain)
    if settings.allowed_origins:  # CORS is off unless origins are named
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.allowed_origins,
            allow_methods=settings.cors_methods,
            allow_headers=settings.cors_headers,
            allow_credentials=settings.allow_credentials,
            expose_headers=[REQUEST_ID_HEADER],
        )
    app.add_middleware(RequestIdMiddleware)  # outermost: every answer carries the request's id
    return app


async def _close_within(backend: TritonBackend, timeout_s: float) -> None:
    """``backend.close()``, left behind (cancelled, not awaited) if it has not ended in ``timeout_s``."""
    closing = asyncio.ensure_future(backend.close())
    try:
        await asyncio.wait({closing}, timeout=timeout_s)
    except BaseException:  # the shutdown itself was cancelled: so is the close
        closing.cancel()
        raise
    if closing.done():
        closing.result()
        return
    logger.warning("closing the Triton client took over %g s: stopping without waiting for it", timeout_s)
    closing.cancel()
