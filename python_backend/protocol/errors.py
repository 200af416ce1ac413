"""The error catalogue: every error the product sends, with one status, type and code each.

Owns: ``ErrorInfo`` (an error as the user sees it, and its wire form inside a Triton error
message), ``ContractError`` (the exception that carries one), ``ErrorKind`` (status, OpenAI type
and code of one kind of error), ``CATALOGUE`` (all of them) and one named constructor per error,
which is the only way the backend and the frontend build one. Statuses follow what OpenAI and
MindIE clients act on: 400 is a bad request (not retried), 401 a bad key, 404 an unknown model or
route, 408 a request that did not arrive in time, 413 a body too large, 431 headers too large, 429
and 503 are retried after ``Retry-After``, 500 an internal error, 504 a timeout. Standard library
only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ErrorInfo:
    """An error as the user sees it: HTTP status plus the OpenAI envelope fields."""

    status: int  # HTTP status the frontend answers with (400, 404, 429, 500, 503, ...)
    message: str  # human-readable, names the offending field; never internal paths
    type: str = "invalid_request_error"  # OpenAI error type
    param: str | None = None  # the request field at fault, dotted ("messages.0.role")
    code: str | None = None  # machine-readable code ("context_length_exceeded", ...)

    def to_wire(self) -> str:
        return json.dumps({"error": asdict(self)}, ensure_ascii=False)

    @staticmethod
    def from_wire(text: str) -> ErrorInfo:
        """Recover an ErrorInfo from a Triton error message.

        Messages that are not ours (Triton's own, e.g. a dead backend stub) become
        ``backend_unavailable`` so that no Triton internals reach the user.
        """
        start = text.find('{"error"')
        if start >= 0:
            try:
                body = json.loads(text[start:])["error"]
                return ErrorInfo(
                    status=int(body["status"]),
                    message=str(body["message"]),
                    type=str(body.get("type") or INVALID_REQUEST),
                    param=body.get("param"),
                    code=body.get("code"),
                )
            except (ValueError, KeyError, TypeError):
                pass  # not our envelope after all: the generic answer below
        return backend_unavailable()


class ContractError(ValueError):
    """A request that breaks the contract or a validation rule; carries the user-facing error."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


# --- OpenAI error types ---------------------------------------------------------------------------
INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_exceeded"
SERVER_ERROR = "server_error"
SERVICE_UNAVAILABLE = "service_unavailable"
TIMEOUT = "timeout"


@dataclass(frozen=True)
class ErrorKind:
    """One kind of error: the same status, type and code wherever it is raised."""

    status: int
    type: str
    code: str | None  # None only for a plain bad field (OpenAI sends ``code: null`` for those)

    def info(self, message: str, param: str | None = None) -> ErrorInfo:
        return ErrorInfo(self.status, message, self.type, param, self.code)


INVALID = ErrorKind(400, INVALID_REQUEST, None)
INVALID_JSON = ErrorKind(400, INVALID_REQUEST, "invalid_json")
INVALID_CONTENT_LENGTH = ErrorKind(400, INVALID_REQUEST, "invalid_content_length")
INVALID_HTTP = ErrorKind(400, INVALID_REQUEST, "invalid_http_request")
DUPLICATE_HEADER = ErrorKind(400, INVALID_REQUEST, "duplicate_header")
CONTEXT_TOO_LONG = ErrorKind(400, INVALID_REQUEST, "context_length_exceeded")
KV_CACHE_EXCEEDED = ErrorKind(400, INVALID_REQUEST, "kv_cache_exceeded")
UNAUTHORIZED = ErrorKind(401, INVALID_REQUEST, "invalid_api_key")
MODEL_NOT_FOUND = ErrorKind(404, INVALID_REQUEST, "model_not_found")
ROUTE_NOT_FOUND = ErrorKind(404, NOT_FOUND, "not_found")
METHOD_NOT_ALLOWED = ErrorKind(405, INVALID_REQUEST, "method_not_allowed")
REQUEST_TIMEOUT = ErrorKind(408, INVALID_REQUEST, "request_timeout")
BODY_TOO_LARGE = ErrorKind(413, INVALID_REQUEST, "request_too_large")
HEADERS_TOO_LARGE = ErrorKind(431, INVALID_REQUEST, "headers_too_large")
PREPARE_TIMEOUT = ErrorKind(400, INVALID_REQUEST, "prepare_timeout")
OVERLOADED = ErrorKind(429, RATE_LIMIT, "overloaded")
PREPARERS_BUSY = ErrorKind(429, RATE_LIMIT, "preparers_busy")
INTERNAL = ErrorKind(500, SERVER_ERROR, "internal_error")
BACKEND_INCOMPLETE = ErrorKind(500, SERVER_ERROR, "backend_incomplete")
SHUTTING_DOWN = ErrorKind(503, SERVICE_UNAVAILABLE, "shutting_down")
DRAINING = ErrorKind(503, SERVICE_UNAVAILABLE, "server_draining")
ENGINE_FAILED = ErrorKind(503, SERVICE_UNAVAILABLE, "engine_failed")
ENGINE_STOPPED = ErrorKind(503, SERVICE_UNAVAILABLE, "engine_stopped")
ENGINE_STALLED = ErrorKind(503, SERVICE_UNAVAILABLE, "engine_stalled")
CHANNEL_CLOSED = ErrorKind(503, SERVICE_UNAVAILABLE, "channel_closed")
BACKEND_UNAVAILABLE = ErrorKind(503, SERVICE_UNAVAILABLE, "backend_unavailable")
BACKEND_NOT_READY = ErrorKind(503, SERVICE_UNAVAILABLE, "backend_not_ready")
TOO_MANY_CONNECTIONS = ErrorKind(503, SERVICE_UNAVAILABLE, "too_many_connections")
TOKEN_TIMEOUT = ErrorKind(504, TIMEOUT, "token_timeout")
E2E_TIMEOUT = ErrorKind(504, TIMEOUT, "timeout")

CATALOGUE: tuple[ErrorKind, ...] = (
    INVALID,
    INVALID_JSON,
    INVALID_CONTENT_LENGTH,
    INVALID_HTTP,
    DUPLICATE_HEADER,
    CONTEXT_TOO_LONG,
    KV_CACHE_EXCEEDED,
    UNAUTHORIZED,
    MODEL_NOT_FOUND,
    ROUTE_NOT_FOUND,
    METHOD_NOT_ALLOWED,
    REQUEST_TIMEOUT,
    BODY_TOO_LARGE,
    HEADERS_TOO_LARGE,
    PREPARE_TIMEOUT,
    OVERLOADED,
    PREPARERS_BUSY,
    INTERNAL,
    BACKEND_INCOMPLETE,
    SHUTTING_DOWN,
    DRAINING,
    ENGINE_FAILED,
    ENGINE_STOPPED,
    ENGINE_STALLED,
    CHANNEL_CLOSED,
    BACKEND_UNAVAILABLE,
    BACKEND_NOT_READY,
    TOO_MANY_CONNECTIONS,
    TOKEN_TIMEOUT,
    E2E_TIMEOUT,
)


# --- 400: the request is wrong ------------------------------------------------------------------
def invalid(message: str, param: str | None, code: str | None = None) -> ContractError:
    """The 400 for a bad field; ``code`` only for a family of its own (the media layer's)."""
    return ContractError(ErrorInfo(INVALID.status, message, INVALID.type, param, code))


def invalid_json() -> ErrorInfo:
    return INVALID_JSON.info("request body is not valid JSON")


def invalid_content_length() -> ErrorInfo:
    return INVALID_CONTENT_LENGTH.info("invalid Content-Length header")


def context_too_long(prompt_tokens: int, limit: int) -> ErrorInfo:
    return CONTEXT_TOO_LONG.info(
        f"the prompt has {prompt_tokens} tokens; the limit is {limit} "
        "(min of maxInputTokenLen, maxSeqLen - 1 and the model's max_position_embeddings)",
        "messages",
    )


def kv_cache_exceeded(needed: int, budget: int) -> ErrorInfo:
    return KV_CACHE_EXCEEDED.info(
        f"the request may need {needed} tokens of KV cache (prompt + max_tokens, times n/best_of); "
        f"the server's budget is {budget}",
        "max_tokens",
    )


def prepare_timed_out(seconds: float, param: str) -> ErrorInfo:
    """The request's own preparation (chat template, tokenizing, media) outlasted its deadline."""
    return PREPARE_TIMEOUT.info(
        f"preparing the prompt (chat template, tokenizing, media decoding) took longer than {seconds:g} s "
        "(prepare_timeout_s); send a shorter prompt or fewer media",
        param,
    )


def invalid_http_request() -> ErrorInfo:
    """A request the HTTP parser refused (bad request line, header syntax, framing)."""
    return INVALID_HTTP.info("invalid HTTP request")


def duplicate_header(name: str) -> ErrorInfo:
    """A header that must appear at most once appeared more often."""
    return DUPLICATE_HEADER.info(f"the '{name}' header must be sent at most once")


def input_too_large(param: str, size: int, limit: int, within: str | None = None) -> ErrorInfo:
    """Text bound for the tokenizer or the chat template past the input ceiling; ``within``: the
    field whose parts together crossed it at ``param``."""
    if within is None:
        return INVALID.info(f"'{param}' is {size} characters; the limit is {limit} characters", param)
    return INVALID.info(f"'{within}' reaches {size} characters at '{param}'; the limit is {limit} characters", param)


def nested_too_deep(param: str, limit: int) -> ErrorInfo:
    """A value the chat template renders nests deeper than the nesting ceiling."""
    return INVALID.info(f"'{param}' is nested deeper than {limit} levels of arrays and objects (the limit)", param)


def json_too_deep(levels: int) -> ErrorInfo:
    """A body the JSON parser gave up on for its depth (it recurses once per level)."""
    return INVALID_JSON.info(f"request body is nested deeper than the JSON parser's limit of about {levels} levels")


# --- 401 / 404 / 405 / 408 / 413 / 431 ----------------------------------------------------------
def unauthorized() -> ErrorInfo:
    return UNAUTHORIZED.info("invalid or missing API key")


def model_not_found(name: str) -> ErrorInfo:
    """An unknown ``model`` (served name or adapter), in the words OpenAI uses."""
    return MODEL_NOT_FOUND.info(f"The model '{name}' does not exist", "model")


def body_too_large(limit: int) -> ErrorInfo:
    return BODY_TOO_LARGE.info(f"request body is larger than {limit} bytes")


def request_timeout(seconds: float, part: str) -> ErrorInfo:
    """The client did not send the whole request (``part``: its headers or its body) in time."""
    return REQUEST_TIMEOUT.info(f"the request {part} did not arrive within {seconds:g} s")


def headers_too_large(what: str) -> ErrorInfo:
    """The request line and headers passed a limit (``what`` says which)."""
    return HEADERS_TOO_LARGE.info(f"request headers too large: {what}")


def too_many_connections(limit: int) -> ErrorInfo:
    return TOO_MANY_CONNECTIONS.info(f"the server has {limit} open connections, its limit; retry later")


def http_error(status: int, message: str) -> ErrorInfo:
    """An HTTP error of the web framework's own (unknown route, wrong method) in OpenAI terms."""
    kinds = {k.status: k for k in (UNAUTHORIZED, ROUTE_NOT_FOUND, METHOD_NOT_ALLOWED, BODY_TOO_LARGE)}
    kind = kinds.get(status)
    if kind is not None:
        return kind.info(message)
    return ErrorInfo(status, message, SERVER_ERROR if status >= 500 else INVALID_REQUEST)


# --- 429 / 503: retry later ---------------------------------------------------------------------
def overloaded(waiting: int) -> ErrorInfo:
    return OVERLOADED.info(f"the server is overloaded ({waiting} requests waiting); retry later")


def preparers_busy(seconds: float, workers: int) -> ErrorInfo:
    """The request waited its whole preparation deadline for a free preparer thread."""
    return PREPARERS_BUSY.info(
        f"no preparer thread was free within {seconds:g} s (all {workers} prepare_workers busy with "
        "other prompts); retry later"
    )


def shutting_down() -> ErrorInfo:
    """The model is stopping (its engine refuses new work)."""
    return SHUTTING_DOWN.info("the model is shutting down")


def draining() -> ErrorInfo:
    """The frontend is draining before it stops."""
    return DRAINING.info("server is shutting down")


def engine_failed() -> ErrorInfo:
    return ENGINE_FAILED.info("the engine stopped after an internal error")


def rank_failed(rank: int, exit_code: int) -> ErrorInfo:
    """A tensor-parallel rank's process exited: the model cannot run a step without it."""
    return ENGINE_FAILED.info(f"tensor-parallel rank {rank} exited (code {exit_code})")


def rank_silent(rank: int, node: int, seconds: float) -> ErrorInfo:
    """A tensor-parallel rank on another node stopped answering: its node is gone or cut off."""
    return ENGINE_FAILED.info(f"tensor-parallel rank {rank} on node {node} has been silent for {seconds:.0f} s")


def engine_stopped() -> ErrorInfo:
    return ENGINE_STOPPED.info("the engine is not running")


def engine_stalled(seconds: float) -> ErrorInfo:
    return ENGINE_STALLED.info(f"the engine has made no progress for {seconds:.0f} s")


def channel_closed(name: str, param: str) -> ErrorInfo:
    """No open response channel of that name (usually a race with a restart or a close)."""
    return CHANNEL_CLOSED.info(f"no open response channel named '{name}'", param)


def backend_unavailable() -> ErrorInfo:
    """The one message for "cannot reach the model": never addresses or Triton internals."""
    return BACKEND_UNAVAILABLE.info("model backend unavailable")


def backend_not_ready() -> ErrorInfo:
    return BACKEND_NOT_READY.info("model backend not ready")


# --- 500 / 504 ----------------------------------------------------------------------------------
def internal(message: str = "internal server error") -> ErrorInfo:
    """An internal failure; ``message`` says which step failed, never why (that is logged)."""
    return INTERNAL.info(message)


EARLY_END_MESSAGE = "model backend ended the response early"


def backend_incomplete() -> ErrorInfo:
    """The backend's answer ended before every choice finished."""
    return BACKEND_INCOMPLETE.info(EARLY_END_MESSAGE)


def token_timeout(seconds: float) -> ErrorInfo:
    """MindIE's ``tokenTimeout`` ran out: the model sent nothing for that long."""
    return TOKEN_TIMEOUT.info(f"the model sent nothing within the token timeout ({seconds:g} s)")


def e2e_timeout(seconds: float) -> ErrorInfo:
    """MindIE's ``e2eTimeout`` ran out (the gRPC call's deadline)."""
    return E2E_TIMEOUT.info(f"the request did not finish within the end-to-end timeout ({seconds:g} s)")
