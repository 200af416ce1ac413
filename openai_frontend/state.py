"""Per-app state shared by the routes: the settings and the backend.

Owns: ``FrontendState`` (stored on ``app.state.frontend`` by ``create_app``; one per app, never a
module global: settings, backend, media loader, metrics, drain state) and the typed accessors the routes use to reach it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request

from openai_frontend.client.base import ChatBackend, backend_unavailable
from openai_frontend.http.drain import DrainState
from openai_frontend.http.metrics import FrontendMetrics
from openai_frontend.media.loader import MediaLoader
from openai_frontend.settings import FrontendSettings


@dataclass
class FrontendState:
    """What one app instance serves with."""

    settings: FrontendSettings
    media: MediaLoader
    metrics: FrontendMetrics
    # None until the lifespan created the Triton client (or after shutdown closed it).
    backend: ChatBackend | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))  # ``created`` of /v1/models entries
    drain: DrainState = field(default_factory=DrainState)  # graceful shutdown (drain.py)


def frontend_state(request: Request) -> FrontendState:
    state = request.app.state.frontend
    if not isinstance(state, FrontendState):
        raise TypeError("app.state.frontend is not set; build the app with create_app()")
    return state


def require_backend(request: Request) -> ChatBackend:
    """The backend, or the 503 every route answers while there is none."""
    backend = frontend_state(request).backend
    if backend is None:
        raise backend_unavailable()
    return backend
