"""The error catalogue: one status, type and code per error, as OpenAI and MindIE clients expect."""

from __future__ import annotations

from pathlib import Path

import pytest

from python_backend.protocol import errors
from python_backend.protocol.errors import CATALOGUE, ErrorInfo, ErrorKind

REPO = Path(__file__).resolve().parents[2]

# The status each OpenAI error type comes with (openai-python maps 400/401/404/429/5xx to its
# exception classes and retries 429 and 5xx; MindIE clients read the same statuses).
STATUSES_OF_TYPE = {
    errors.INVALID_REQUEST: {400, 401, 404, 405, 408, 413, 431},
    errors.NOT_FOUND: {404},
    errors.RATE_LIMIT: {429},
    errors.SERVER_ERROR: {500},
    errors.SERVICE_UNAVAILABLE: {503},
    errors.TIMEOUT: {504},
}

# Every named constructor, called as the product calls it.
CONSTRUCTED: list[ErrorInfo] = [
    errors.invalid("'temperature' must be >= 0.0, got -1", "temperature").info,
    errors.invalid_json(),
    errors.invalid_content_length(),
    errors.context_too_long(5000, 4096),
    errors.kv_cache_exceeded(9000, 8192),
    errors.unauthorized(),
    errors.model_not_found("gpt-4"),
    errors.http_error(404, "Not Found"),
    errors.http_error(405, "Method Not Allowed"),
    errors.body_too_large(1024),
    errors.overloaded(64),
    errors.internal(),
    errors.internal("internal error while generating; the request was stopped"),
    errors.backend_incomplete(),
    errors.shutting_down(),
    errors.draining(),
    errors.engine_failed(),
    errors.engine_stopped(),
    errors.engine_stalled(12.3),
    errors.channel_closed("frontend-1234", "stream_channel"),
    errors.backend_unavailable(),
    errors.backend_not_ready(),
    errors.token_timeout(2.5),
    errors.e2e_timeout(30),
    errors.invalid_http_request(),
    errors.duplicate_header("authorization"),
    errors.request_timeout(10, "headers"),
    errors.headers_too_large("64 fields"),
    errors.too_many_connections(8),
    errors.prepare_timed_out(30, "messages"),
    errors.preparers_busy(30, 2),
    errors.input_too_large("prompt", 5_000_000, 4_194_304),
    errors.input_too_large("tools.1.function.parameters", 5_000_000, 4_194_304, "tools"),
    errors.nested_too_deep("tools.0.function.parameters", 64),
    errors.json_too_deep(1000),
]


def test_each_code_has_one_kind() -> None:
    codes = [kind.code for kind in CATALOGUE]
    assert len(codes) == len(set(codes)), codes
    assert len(CATALOGUE) == len(set(CATALOGUE))


@pytest.mark.parametrize("kind", CATALOGUE, ids=lambda kind: kind.code or "invalid")
def test_status_matches_the_openai_type(kind: ErrorKind) -> None:
    assert kind.status in STATUSES_OF_TYPE[kind.type]


def test_retryable_errors_are_429_or_503() -> None:
    retried = {kind.code for kind in CATALOGUE if kind.status in (429, 503)}
    assert retried == {
        "overloaded",
        "preparers_busy",
        "shutting_down",
        "server_draining",
        "engine_failed",
        "engine_stopped",
        "engine_stalled",
        "channel_closed",
        "backend_unavailable",
        "backend_not_ready",
        "too_many_connections",
    }


def test_the_errors_clients_key_on() -> None:
    assert errors.model_not_found("m") == ErrorInfo(
        404, "The model 'm' does not exist", "invalid_request_error", "model", "model_not_found"
    )
    assert errors.unauthorized().status == 401 and errors.unauthorized().code == "invalid_api_key"
    assert (errors.overloaded(3).status, errors.overloaded(3).type) == (429, "rate_limit_exceeded")
    assert errors.internal().type == errors.internal("x").type == "server_error"
    assert errors.context_too_long(10, 5).code == "context_length_exceeded"
    assert errors.context_too_long(10, 5).param == "messages"


@pytest.mark.parametrize("info", CONSTRUCTED, ids=lambda info: info.code or info.message)
def test_every_constructor_builds_a_catalogue_kind(info: ErrorInfo) -> None:
    assert ErrorKind(info.status, info.type, info.code) in CATALOGUE
    assert info.message


def test_errors_are_built_only_by_the_catalogue() -> None:
    sources = [*REPO.glob("python_backend/**/*.py"), *REPO.glob("openai_frontend/**/*.py")]
    inline = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sources
        if path != REPO / "python_backend/protocol/errors.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "ErrorInfo(" in line
    ]
    assert inline == []


def test_error_round_trip_and_foreign_errors() -> None:
    info = ErrorInfo(429, "busy", "rate_limit_exceeded", None, "overloaded")
    assert ErrorInfo.from_wire(info.to_wire()) == info
    # Triton prefixes or wraps messages; the JSON is still found.
    assert ErrorInfo.from_wire("in ensemble: " + info.to_wire()) == info
    foreign = ErrorInfo.from_wire("Stub process 'triton_chat_0_0' is not healthy.")
    assert foreign == errors.backend_unavailable() and "Stub" not in foreign.message
