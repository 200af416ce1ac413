"""``POST /tokenize`` and ``POST /detokenize``, in vLLM's request and response shapes.

Owns: the bodies (``{"model", "prompt"}`` or ``{"model", "messages", "add_generation_prompt"}``
to ``{"count", "max_model_len", "tokens"}``; ``{"model", "tokens"}`` to ``{"prompt"}``), their
checks at this edge (the same ``messages`` rules as chat, ``prompt``, ``tokens`` and ``tools``
under the input ceilings before anything goes to the model, a served ``model``, unknown fields
refused by name), and asking the model, which owns the tokenizer and the chat template (the
contract's ``tokenize`` request, answered without generating).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from openai_frontend.chat.schemas import documented_errors
from openai_frontend.state import frontend_state, require_backend
from python_backend.protocol.errors import ContractError, invalid, model_not_found
from python_backend.protocol.input_limits import check_input_size, check_tools
from python_backend.protocol.messages import validate_messages
from python_backend.protocol.tokenize import DetokenizeQuery, TokenizeQuery, check_tokens

router = APIRouter(tags=["tokenize"])


class TokenizeRequest(BaseModel):
    """A prompt, or chat messages rendered with the model's chat template."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, description="a served model name; absent: the base model")
    prompt: StrictStr | None = Field(default=None, description="raw text, tokenized as a completion prompt")
    messages: list[dict[str, Any]] | None = Field(default=None, description="chat messages, as in chat completions")
    add_generation_prompt: StrictBool = Field(default=True, description="end with the assistant's turn opening")
    add_special_tokens: StrictBool | None = Field(
        default=None, description="add the tokenizer's special tokens (default: yes for a prompt, no for messages)"
    )
    tools: list[dict[str, Any]] | None = Field(default=None, description="tools the template renders")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="as in chat completions")


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int = Field(description="prompt plus output tokens the model takes")
    tokens: list[int]


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[StrictInt]


class DetokenizeResponse(BaseModel):
    prompt: str


def _check_model(request: Request, model: str | None) -> None:
    if model is not None and model not in frontend_state(request).settings.model_names:
        raise ContractError(model_not_found(model))


def _query(body: TokenizeRequest) -> TokenizeQuery:
    if (body.prompt is None) == (body.messages is None):
        raise invalid("give exactly one of 'prompt' and 'messages'", "prompt" if body.prompt is not None else None)
    if body.prompt is not None:
        check_input_size(body.prompt, "prompt")
        return TokenizeQuery(prompt=body.prompt, add_special_tokens=body.add_special_tokens)
    messages = validate_messages(body.messages)
    check_tools(body.tools)
    return TokenizeQuery(
        messages=messages,
        add_generation_prompt=body.add_generation_prompt,
        add_special_tokens=body.add_special_tokens,
        tools=body.tools,
        chat_template_kwargs=body.chat_template_kwargs or {},
    )


@router.post("/tokenize", responses=documented_errors(400, 401, 404, 503))
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    _check_model(request, body.model)
    query = _query(body)
    answer = await require_backend(request).tokenize(query)
    return TokenizeResponse(count=answer.count, max_model_len=answer.max_model_len, tokens=answer.tokens)


@router.post("/detokenize", responses=documented_errors(400, 401, 404, 503))
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    _check_model(request, body.model)
    answer = await require_backend(request).detokenize(DetokenizeQuery(check_tokens(body.tokens)))
    return DetokenizeResponse(prompt=answer.prompt)
