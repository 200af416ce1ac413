"""What the generation endpoints (``routes.chat``, ``routes.completions``) share.

Owns: their OpenAPI declaration (``generation_route``: the body's schema, JSON or SSE answers, the
documented errors), the arrival of a request (``arrive``: timing from arrival, the body read and
validated, in a worker thread when large, the backend, ``x-ignored-params``) and the answer
(``answer``: JSON, or SSE once the first events are ready, both raced against client disconnect).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from openai_frontend.chat.schemas import documented_errors
from openai_frontend.chat.serving import StartedStream, events
from openai_frontend.client.base import ChatBackend
from openai_frontend.http.cancellation import ClientDisconnected, ClientGoneResponse, SSEResponse, run_until_disconnect
from openai_frontend.http.headers import ignored_params_headers
from openai_frontend.http.metrics import ChatObservation
from openai_frontend.settings import FrontendSettings
from openai_frontend.state import frontend_state, require_backend
from python_backend.protocol.params import GenerationParams

# Bodies above this are parsed and validated in a worker thread: a multi-megabyte JSON body would
# otherwise hold the event loop (and every other request, /health included) for tens of ms.
OFFLOAD_BODY_BYTES = 256 * 1024


class Validated(Protocol):
    """A validated request body: it names the body fields it ignored."""

    @property
    def ignored(self) -> tuple[str, ...]: ...

    @property
    def params(self) -> GenerationParams: ...


V = TypeVar("V", bound=Validated)


def generation_route(schema: type[BaseModel], answer_object: str) -> dict[str, Any]:
    """``router.post``'s keyword arguments for an endpoint answering ``answer_object``s."""
    return {
        # The body is parsed by the endpoint's validator (so errors follow the contract's order),
        # so its schema is declared here for OpenAPI instead of through a body parameter.
        "openapi_extra": {
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema.model_json_schema()}}}
        },
        "responses": {
            200: {
                "description": f"{answer_object} JSON, or text/event-stream chunks when stream is true",
                "content": {"application/json": {}, "text/event-stream": {}},
            },
            **documented_errors(400, 401, 404, 413, 429, 500, 503, 504),
        },
    }


async def read_validated(request: Request, validate: Callable[[bytes, FrontendSettings], V]) -> V | None:
    """The body, read and validated (in a worker thread when large); None: the client left."""
    settings = frontend_state(request).settings
    try:
        body = await request.body()
    except ClientDisconnect:
        return None
    if len(body) > OFFLOAD_BODY_BYTES:
        return await anyio.to_thread.run_sync(validate, body, settings)
    return validate(body, settings)


@dataclass(frozen=True)
class Arrival(Generic[V]):
    """A generation request that arrived whole and valid."""

    body: V
    observation: ChatObservation  # TTFT and latency, counted from the arrival
    backend: ChatBackend
    headers: dict[str, str]  # x-ignored-params


async def arrive(request: Request, validate: Callable[[bytes, FrontendSettings], V]) -> Arrival[V] | None:
    """The request, timed from now, read and validated; None: the client left before it was read.
    A bad body raises the 400 to answer; no backend, the 503."""
    observation = frontend_state(request).metrics.observe(time.monotonic())
    body = await read_validated(request, validate)
    if body is None:
        return None
    observation.for_adapter(body.params.lora)
    return Arrival(body, observation, require_backend(request), ignored_params_headers(body.ignored))


async def answer(
    request: Request,
    arrival: Arrival[Any],
    stream: bool,
    start: Callable[[], Coroutine[Any, Any, StartedStream]],
    whole: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
) -> Response:
    """SSE once ``start`` has the first events (when ``stream``), else ``whole`` as JSON; a client
    that leaves meanwhile gets nothing (the work is cancelled)."""
    try:
        if stream:
            started = await run_until_disconnect(request, start())
            return SSEResponse(events(started, frontend_state(request).drain), headers=arrival.headers)
        result = await run_until_disconnect(request, whole())
    except ClientDisconnected:
        return ClientGoneResponse()
    return JSONResponse(result, headers=arrival.headers)
