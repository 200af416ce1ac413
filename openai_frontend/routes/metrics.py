"""``GET /metrics``: the frontend's Prometheus metrics (``openai_frontend.http.metrics``).

Owns: the route only. When API keys are set it needs one like every route but the health probes
: request counts and model names are not for anyone who can reach the port.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from openai_frontend.state import frontend_state

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(frontend_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
