"""One error envelope for every non-2xx answer: ``{"error": {"message", "type", "param", "code"}}``.

Owns: building error responses from ``ErrorInfo`` (the contract's user-facing error), the
exception handlers installed on the app (validation, backend, HTTP, body size and deadline,
catch-all), and the
``Retry-After`` rule for 429/503. Never ``{"detail": ...}``, never a traceback or a path in a body:
unexpected exceptions are logged in full and answered with a fixed 500 message.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from openai_frontend.client.base import BackendError
from openai_frontend.http.request_id import LOG_FIELD, REQUEST_ID_HEADER, request_id_of
from python_backend.protocol.errors import (
    INVALID,
    ContractError,
    ErrorInfo,
    body_too_large,
    http_error,
    internal,
    invalid_json,
    json_too_deep,
    request_timeout,
)

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # seconds a 429/503 client should wait; overload and restarts clear quickly
_RETRYABLE = (429, 503)


class BodyTimedOut(Exception):
    """The request body did not arrive in full within its deadline."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"request body did not arrive within {timeout_s:g} s")
        self.timeout_s = timeout_s


class BodyTooLarge(Exception):
    """The request body passed the configured limit while it was being read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit


def error_response(info: ErrorInfo, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The envelope for ``info``; 429/503 also tell the client when to retry."""
    all_headers = dict(headers or {})
    if info.status in _RETRYABLE:
        all_headers.setdefault("Retry-After", str(RETRY_AFTER_S))
    body = {"error": {"message": info.message, "type": info.type, "param": info.param, "code": info.code}}
    return JSONResponse(body, status_code=info.status, headers=all_headers)


def _loc_to_param(loc: Sequence[Any]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


def info_from_validation_errors(errors: Sequence[Mapping[str, Any]]) -> ErrorInfo:
    """A 400 naming the first field pydantic rejected (pydantic's message, without its URL)."""
    if not errors:
        return INVALID.info("invalid request")
    first = errors[0]
    param = _loc_to_param(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        return invalid_json()
    message = str(first.get("msg", "invalid value"))
    text = f"'{param}': {message}" if param else message
    return INVALID.info(text, param)


async def _contract_error(_: Request, exc: ContractError) -> JSONResponse:
    return error_response(exc.info)


async def _backend_error(_: Request, exc: BackendError) -> JSONResponse:
    return error_response(exc.info)


async def _request_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(info_from_validation_errors(list(exc.errors())))


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    if isinstance(exc.__cause__, RecursionError):  # FastAPI's body parser gave up on a deep body
        return error_response(json_too_deep(sys.getrecursionlimit()))
    return error_response(http_error(exc.status_code, str(exc.detail)), headers=exc.headers)


async def _body_too_large(_: Request, exc: BodyTooLarge) -> JSONResponse:
    return error_response(body_too_large(exc.limit))


async def _body_timed_out(_: Request, exc: BodyTimedOut) -> JSONResponse:
    # The rest of the body may still come: the connection cannot carry another request.
    return error_response(request_timeout(exc.timeout_s, "body"), headers={"Connection": "close"})


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Starlette runs this handler outside every middleware, so the request id's context and
    # header are added here.
    request_id = request_id_of(request).value
    path = request.scope.get("path")
    logger.exception("unhandled error on %s %s", request.method, path, exc_info=exc, extra={LOG_FIELD: request_id})
    return error_response(internal(), headers={REQUEST_ID_HEADER: request_id})


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can raise to the envelope."""
    # The decorator form, because add_exception_handler is typed for handlers of plain Exception.
    app.exception_handler(ContractError)(_contract_error)
    app.exception_handler(BackendError)(_backend_error)
    app.exception_handler(RequestValidationError)(_request_validation_error)
    app.exception_handler(StarletteHTTPException)(_http_error)
    app.exception_handler(BodyTooLarge)(_body_too_large)
    app.exception_handler(BodyTimedOut)(_body_timed_out)
    app.exception_handler(Exception)(_unexpected)
