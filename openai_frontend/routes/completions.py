"""``POST /v1/completions``: the legacy (raw prompt) completions endpoint.

Owns: the endpoint's wiring only: its call, JSON or SSE; reading the body, racing client
disconnect and ``x-ignored-params`` are ``routes.generation``'s, as for chat. Formats and the
backend dialogue live in ``openai_frontend.completions``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from openai_frontend.completions.schemas import CompletionRequest
from openai_frontend.completions.serving import CompletionCall, complete, start_stream
from openai_frontend.completions.validation import validate_completion_request
from openai_frontend.http.cancellation import ClientGoneResponse
from openai_frontend.http.request_id import request_id_of
from openai_frontend.routes.generation import answer, arrive, generation_route
from openai_frontend.state import frontend_state

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", **generation_route(CompletionRequest, "text_completion"))
async def create_completion(request: Request) -> Response:
    arrival = await arrive(request, validate_completion_request)
    if arrival is None:
        return ClientGoneResponse()
    completion, backend = arrival.body, arrival.backend
    ids = request_id_of(request).answer_ids("cmpl")
    settings = frontend_state(request).settings
    call = CompletionCall(completion, settings, arrival.observation, request_id=ids.response, backend_id=ids.backend)
    return await answer(
        request, arrival, completion.stream, lambda: start_stream(backend, call), lambda: complete(backend, call)
    )
