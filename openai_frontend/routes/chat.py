"""``POST /v1/chat/completions``.

Owns: the endpoint's wiring only: read and validate the body, load its media (after validation,
before any response byte, so a media error is a plain 400 even for ``stream: true``), pick JSON /
SSE (with keep-alive comments from the start when ``--sse-keepalive`` is set) / the beam-search
pseudo-stream, name the answer after the request's ``X-Request-Id``, race the work against client disconnect, and add
``x-ignored-params``. Formats live in ``responses``/``sse``, the backend dialogue in ``serving``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from openai_frontend.chat.schemas import ChatCompletionRequest, documented_errors
from openai_frontend.chat.serving import ChatCall, complete, events, keepalive_events, start_stream
from openai_frontend.chat.validation import validate_chat_request
from openai_frontend.http.cancellation import ClientDisconnected, ClientGoneResponse, SSEResponse, run_until_disconnect
from openai_frontend.http.headers import ignored_params_headers
from openai_frontend.http.request_id import request_id_of
from openai_frontend.settings import FrontendSettings
from openai_frontend.state import frontend_state, require_backend

router = APIRouter(tags=["chat"])
T = TypeVar("T")

# Bodies above this are parsed and validated in a worker thread: a multi-megabyte JSON body would
# otherwise hold the event loop (and every other request, /health included) for tens of ms.
OFFLOAD_BODY_BYTES = 256 * 1024

# The body is parsed by validate_chat_request (so errors follow the contract's order), so the
# schema is declared here for OpenAPI instead of through a body parameter.
_OPENAPI_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ChatCompletionRequest.model_json_schema()}},
    }
}


async def read_validated(request: Request, validate: Callable[[bytes, FrontendSettings], T]) -> T | None:
    """The body, read and validated (in a worker thread when large); None: the client left."""
    settings = frontend_state(request).settings
    try:
        body = await request.body()
    except ClientDisconnect:
        return None
    if len(body) > OFFLOAD_BODY_BYTES:
        return await anyio.to_thread.run_sync(validate, body, settings)
    return validate(body, settings)


@router.post(
    "/v1/chat/completions",
    openapi_extra=_OPENAPI_BODY,
    responses={
        200: {
            "description": "chat.completion JSON, or text/event-stream chunks when stream is true",
            "content": {"application/json": {}, "text/event-stream": {}},
        },
        **documented_errors(400, 401, 404, 413, 429, 500, 503, 504),
    },
)
async def create_chat_completion(request: Request) -> Response:
    state = frontend_state(request)
    observation = state.metrics.observe(time.monotonic())  # TTFT and latency count from arrival
    chat = await read_validated(request, validate_chat_request)
    if chat is None:
        return ClientGoneResponse()
    backend = require_backend(request)
    headers = ignored_params_headers(chat.ignored)
    try:
        media = await run_until_disconnect(request, state.media.load(chat.media)) if chat.media else []
        ids = request_id_of(request).answer_ids("chatcmpl")
        call = ChatCall(chat, state.settings, observation, media, request_id=ids.response, backend_id=ids.backend)
        if chat.stream and not call.pseudo_stream and state.settings.sse_keepalive_s > 0:
            keepalive = state.settings.sse_keepalive_s
            return SSEResponse(keepalive_events(backend, call, keepalive, state.drain), headers=headers)
        if chat.stream and not call.pseudo_stream:
            started = await run_until_disconnect(request, start_stream(backend, call))
            return SSEResponse(events(started, state.drain), headers=headers)
        result = await run_until_disconnect(request, complete(backend, call))
    except ClientDisconnected:
        return ClientGoneResponse()
    return JSONResponse(result, headers=headers)
