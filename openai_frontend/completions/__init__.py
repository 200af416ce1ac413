"""The legacy completions endpoint's logic (``POST /v1/completions``): the request schema, prompt
and field validation, serving several prompts as one answer, SSE chunks and whole responses.

A raw prompt goes to the model as the contract's ``text_input`` (no chat template), token ids as
its ``prompt_token_ids``. What chat and completions share is chat's
(``chat.schemas.GenerationRequest``, ``chat.validation``, ``chat.serving``, ``chat.sse``,
``chat.responses``): this package shapes only what differs.
Imports openai_frontend.chat, client.base, http, settings, python_backend.protocol, fastapi and
pydantic; never media (completions take no media) nor the gRPC client.
"""
