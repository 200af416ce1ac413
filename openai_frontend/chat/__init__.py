"""The chat-completions endpoint's logic: the request schema, validation, serving, SSE chunks and
whole responses. Imports protocol, client.base, http, media, aio, fastapi and pydantic.
"""
