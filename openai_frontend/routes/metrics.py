"""``GET /metrics``: the frontend's Prometheus metrics (``openai_frontend.http.metrics``).

Owns: the route only; the engine's gauges, when the frontend knows Triton's metrics address, are
read at each scrape. When API keys are set it needs one like every route but the health probes
: request counts and model names are not for anyone who can reach the port.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from openai_frontend.state import frontend_state

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    # In a worker thread: rendering may read the engine's gauges from Triton over HTTP.
    body = await asyncio.to_thread(frontend_state(request).metrics.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
