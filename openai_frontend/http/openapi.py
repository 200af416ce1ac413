"""The served OpenAPI document says what the server really answers.

Owns: ``install_openapi``, which finishes FastAPI's generated schema once: FastAPI adds a 422
"Validation Error" to any operation with parameters, which this server never sends (every
validation failure is a 400 in the envelope), so it and its schemas are removed; and the statuses
the HTTP layer itself can answer on any route (a request the parser refuses, headers too large or
too slow, a body over the limit, the connection cap) are added to every operation, all with the
error envelope. The request bodies of the models it is given are served exactly as pydantic
writes them: FastAPI's OpenAPI model turns integer bounds into floats (``2^64-1`` into ``2^64``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

ENVELOPE_REF = "#/components/schemas/ErrorEnvelope"
# What any route can get before it runs (openai_frontend.http.limits, body_limit).
TRANSPORT_ERRORS = {
    400: "invalid HTTP request (bad request line, header syntax or framing)",
    408: "the request headers or body did not arrive in time",
    413: "request body too large",
    431: "request headers too large or too many",
    503: "too many open connections; retry after Retry-After seconds",
}
_FASTAPI_ONLY = ("HTTPValidationError", "ValidationError")


def finish_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without FastAPI's 422 and with the transport's statuses on every operation."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status, description in TRANSPORT_ERRORS.items():
                responses.setdefault(
                    str(status),
                    {"description": description, "content": {"application/json": {"schema": {"$ref": ENVELOPE_REF}}}},
                )
    components = schema.get("components", {}).get("schemas", {})
    for name in _FASTAPI_ONLY:
        components.pop(name, None)
    return schema


def _exact_bodies(schema: dict[str, Any], models: Sequence[type[BaseModel]]) -> None:
    exact = {model.__name__: model.model_json_schema() for model in models}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            title = content.get("schema", {}).get("title")
            if title in exact:
                content["schema"] = copy.deepcopy(exact[title])


def install_openapi(app: FastAPI, request_models: Sequence[type[BaseModel]] = ()) -> None:
    """Serve the finished schema at the app's ``openapi_url``; ``request_models`` as declared."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = finish_schema(generate())
            _exact_bodies(schema, request_models)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise it
