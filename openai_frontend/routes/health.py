"""``GET /health`` (liveness) and ``GET /health/ready`` (readiness).

Owns: the probe answers. Liveness never calls the backend (it must stay fast under load, and a
frontend restarted for a backend outage would not bring tritonserver back); readiness is 200
only when the backend says the model is ready and the server is not draining, else the 503
envelope: at once while tritonserver does not answer the frontend's own probes
(``client.health``), the same state in which inference requests get their 503. Neither body
carries internal details. Both are open without an API key (``auth.PUBLIC_PATHS``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from openai_frontend.chat.schemas import documented_errors
from openai_frontend.client.base import BackendError
from openai_frontend.http.drain import DRAINING
from openai_frontend.state import frontend_state
from python_backend.protocol.errors import backend_not_ready

router = APIRouter(tags=["health"])


@router.get("/health")
async def liveness() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/health/ready", responses=documented_errors(503))
async def readiness(request: Request) -> dict[str, str]:
    state = frontend_state(request)
    if state.drain.draining:  # a load balancer stops sending new work at once
        raise BackendError(DRAINING)
    backend = state.backend
    if backend is None or not await backend.is_ready():
        raise BackendError(backend_not_ready())
    return {"status": "ready"}
