"""Graceful drain: stop taking work, let the work in flight finish, then stop.

Owns: ``DrainState`` (per app, on ``FrontendState``: whether the server is draining, and how many
model requests are in flight) and ``DrainMiddleware``, a pure ASGI middleware that counts model
requests (inference, and ``/tokenize`` / ``/detokenize``, which the model answers too) from their
first byte to the last byte of their response (streams included) and, once draining began,
answers new ones 503 with ``Retry-After`` so that a load balancer sends them to another replica.
Streams still open at the deadline end with an error event (``serving.events`` asks ``expired``
after each delta). Readiness reads the same state (``routes.health``). Who starts a drain and
when the process stops is the launcher's business (``launcher.serve``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from openai_frontend.http.errors import error_response
from python_backend.protocol.errors import draining

# The routes that reach the model (prefixes): a drain refuses them all alike, since tritonserver
# stops once the drain ends and a tokenize request then has no model to answer it either.
MODEL_PATHS = ("/v1/chat/", "/v1/completions", "/tokenize", "/detokenize")
# After the deadline, streams that still produce tokens end within one (``serving.events``); a
# stalled one gets this long before the server stops and uvicorn's shutdown cuts it.
EXPIRY_GRACE_S = 1.0
DRAINING = draining()


@dataclass
class DrainState:
    """Whether this app is draining, and the model requests it still serves."""

    draining: bool = False
    in_flight: int = 0
    deadline: float = 0.0  # time.monotonic() after which the launcher stops regardless

    def begin(self, timeout_s: float) -> None:
        """Stop taking model requests; those in flight get ``timeout_s`` seconds to finish."""
        if not self.draining:
            self.draining = True
            self.deadline = time.monotonic() + timeout_s

    def expired(self) -> bool:
        """Draining and past the deadline: open streams end now, with an error event."""
        return self.draining and time.monotonic() >= self.deadline

    def done(self) -> bool:
        """Draining, and nothing is left in flight or the deadline's grace is over too."""
        return self.draining and (self.in_flight == 0 or time.monotonic() >= self.deadline + EXPIRY_GRACE_S)


class DrainMiddleware:
    """Counts model requests and refuses new ones while draining."""

    def __init__(self, app: ASGIApp, state: DrainState) -> None:
        self.app = app
        self._state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(MODEL_PATHS):
            await self.app(scope, receive, send)
            return
        if self._state.draining:
            await error_response(DRAINING)(scope, receive, send)
            return
        self._state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._state.in_flight -= 1
