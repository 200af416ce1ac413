"""``POST /v1/chat/completions``.

Owns: the endpoint's wiring only: read and validate the body, load its media (after validation,
before any response byte, so a media error is a plain 400 even for ``stream: true``), pick JSON /
SSE (with keep-alive comments from the start when ``--sse-keepalive`` is set) / the beam-search
pseudo-stream, and name the answer after the request's ``X-Request-Id``; what every generation
endpoint does (reading, racing client disconnect, ``x-ignored-params``) is ``routes.generation``'s.
Formats live in ``responses``/``sse``, the backend dialogue in ``serving``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from openai_frontend.chat.schemas import ChatCompletionRequest
from openai_frontend.chat.serving import ChatCall, complete, keepalive_events, start_stream
from openai_frontend.chat.validation import validate_chat_request
from openai_frontend.http.cancellation import ClientDisconnected, ClientGoneResponse, SSEResponse, run_until_disconnect
from openai_frontend.http.request_id import request_id_of
from openai_frontend.routes.generation import answer, arrive, generation_route
from openai_frontend.state import frontend_state

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", **generation_route(ChatCompletionRequest, "chat.completion"))
async def create_chat_completion(request: Request) -> Response:
    arrival = await arrive(request, validate_chat_request)
    if arrival is None:
        return ClientGoneResponse()
    chat, backend, state = arrival.body, arrival.backend, frontend_state(request)
    try:
        media = await run_until_disconnect(request, state.media.load(chat.media)) if chat.media else []
    except ClientDisconnected:
        return ClientGoneResponse()
    ids = request_id_of(request).answer_ids("chatcmpl")
    call = ChatCall(chat, state.settings, arrival.observation, media, request_id=ids.response, backend_id=ids.backend)
    streamed = chat.stream and not call.pseudo_stream
    if streamed and state.settings.sse_keepalive_s > 0:
        keepalive = state.settings.sse_keepalive_s
        return SSEResponse(keepalive_events(backend, call, keepalive, state.drain), headers=arrival.headers)
    return await answer(
        request, arrival, streamed, lambda: start_stream(backend, call), lambda: complete(backend, call)
    )
