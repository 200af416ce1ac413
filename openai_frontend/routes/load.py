"""``GET /get_load``: how busy this server is, for load balancers that pick the less busy replica.

Owns: the answer ``{"load": N}``, N the model requests (chat, completions, tokenize) this frontend
is answering now, the count draining waits on. It is the shape ``vllm-router``'s ``power_of_two``
policy reads from each worker (the SGLang-style ``/get_load``; vLLM itself serves none, and the
router then treats every vLLM worker as equally loaded). Reading it costs no backend call.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from openai_frontend.state import frontend_state

router = APIRouter(tags=["load"])


class LoadResponse(BaseModel):
    load: int


@router.get("/get_load", responses={200: {"description": "model requests in flight on this server"}})
async def server_load(request: Request) -> LoadResponse:
    return LoadResponse(load=frontend_state(request).drain.in_flight)
