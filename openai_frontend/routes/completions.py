"""``POST /v1/completions``: the legacy (raw prompt) completions endpoint.

Owns: the endpoint's wiring only: read and validate the body, pick JSON or SSE, race the work
against client disconnect, and add ``x-ignored-params`` (as ``routes.chat`` does). Formats and the
backend dialogue live in ``openai_frontend.completions``.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from openai_frontend.chat.schemas import documented_errors
from openai_frontend.chat.serving import events
from openai_frontend.completions.schemas import CompletionRequest
from openai_frontend.completions.serving import CompletionCall, complete, start_stream
from openai_frontend.completions.validation import validate_completion_request
from openai_frontend.http.cancellation import ClientDisconnected, ClientGoneResponse, SSEResponse, run_until_disconnect
from openai_frontend.http.headers import ignored_params_headers
from openai_frontend.http.request_id import request_id_of
from openai_frontend.routes.chat import read_validated
from openai_frontend.state import frontend_state, require_backend

router = APIRouter(tags=["completions"])

_OPENAPI_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": CompletionRequest.model_json_schema()}},
    }
}


@router.post(
    "/v1/completions",
    openapi_extra=_OPENAPI_BODY,
    responses={
        200: {
            "description": "text_completion JSON, or text/event-stream chunks when stream is true",
            "content": {"application/json": {}, "text/event-stream": {}},
        },
        **documented_errors(400, 401, 404, 413, 429, 500, 503, 504),
    },
)
async def create_completion(request: Request) -> Response:
    state = frontend_state(request)
    observation = state.metrics.observe(time.monotonic())  # TTFT and latency count from arrival
    completion = await read_validated(request, validate_completion_request)
    if completion is None:
        return ClientGoneResponse()
    backend = require_backend(request)
    headers = ignored_params_headers(completion.ignored)
    ids = request_id_of(request).answer_ids("cmpl")
    call = CompletionCall(completion, state.settings, observation, request_id=ids.response, backend_id=ids.backend)
    try:
        if completion.stream:
            started = await run_until_disconnect(request, start_stream(backend, call))
            return SSEResponse(events(started, state.drain), headers=headers)
        result = await run_until_disconnect(request, complete(backend, call))
    except ClientDisconnected:
        return ClientGoneResponse()
    return JSONResponse(result, headers=headers)
