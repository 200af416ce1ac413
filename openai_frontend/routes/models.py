"""``GET /v1/models`` and ``GET /v1/models/{model}``: the served model and its LoRA adapters.

Owns: the OpenAI model-list shape. Adapters name their base model in ``parent`` (as vLLM does).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from openai_frontend.chat.schemas import documented_errors
from openai_frontend.state import FrontendState, frontend_state
from python_backend.protocol.errors import ContractError, model_not_found

router = APIRouter(tags=["models"])

OWNED_BY = "triton-chat"


def _card(state: FrontendState, name: str) -> dict[str, Any]:
    base = state.settings.served_model_name
    return {
        "id": name,
        "object": "model",
        "created": state.started_at,
        "owned_by": OWNED_BY,
        "root": base,
        "parent": None if name == base else base,
    }


@router.get("/v1/models", responses=documented_errors(401))
async def list_models(request: Request) -> dict[str, Any]:
    state = frontend_state(request)
    return {"object": "list", "data": [_card(state, name) for name in state.settings.model_names]}


@router.get("/v1/models/{model:path}", responses=documented_errors(401, 404))
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    state = frontend_state(request)
    if model not in state.settings.model_names:
        raise ContractError(model_not_found(model))
    return _card(state, model)
