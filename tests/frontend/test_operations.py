"""Operations endpoints and headers: /tokenize, /detokenize, /version, /docs, CORS, X-Request-Id."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from frontend_fakes import MAX_MODEL_LEN, MODEL, FakeBackend, chat_body, client_for, settings
from pydantic import ValidationError

from openai_frontend.app import create_app
from python_backend.protocol.tokenize import DetokenizeQuery, TokenizeQuery

ORIGIN = "https://app.example.com"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type",
}


# --- /tokenize, /detokenize -------------------------------------------------------------------
async def test_tokenize_a_prompt_answers_vllms_shape() -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/tokenize", json={"model": MODEL, "prompt": "Hi!"})
    assert response.status_code == 200
    assert response.json() == {"count": 3, "max_model_len": MAX_MODEL_LEN, "tokens": [72, 105, 33]}
    assert backend.queries == [TokenizeQuery(prompt="Hi!")]
    assert backend.requests == []  # nothing was generated


async def test_tokenize_messages_passes_the_template_options_to_the_model() -> None:
    backend = FakeBackend()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hey"}],
        "add_generation_prompt": False,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    async with client_for(backend) as client:
        response = await client.post("/tokenize", json=body)
    assert response.status_code == 200
    assert response.json()["count"] == 3
    (query,) = backend.queries
    assert isinstance(query, TokenizeQuery)
    assert query.messages == [{"role": "user", "content": "Hey"}]
    assert query.add_generation_prompt is False and query.special_tokens is False
    assert query.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": MODEL, "prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400, "prompt"),
        ({"model": MODEL}, 400, None),
        ({"model": MODEL, "prompt": "a", "return_token_strs": True}, 400, "return_token_strs"),
        ({"model": MODEL, "prompt": 5}, 400, "prompt"),
        ({"model": MODEL, "messages": [{"role": "user", "content": ""}]}, 400, "messages.0.content"),
        ({"model": "other", "prompt": "a"}, 404, "model"),
    ],
)
async def test_bad_tokenize_requests_name_the_field(body: dict, status: int, param: str | None) -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/tokenize", json=body)
    assert response.status_code == status
    assert response.json()["error"]["param"] == param
    assert backend.queries == []


async def test_detokenize_answers_the_prompt() -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/detokenize", json={"model": MODEL, "tokens": [72, 105]})
    assert response.status_code == 200
    assert response.json() == {"prompt": "Hi"}
    assert backend.queries == [DetokenizeQuery([72, 105])]


@pytest.mark.parametrize(
    ("tokens", "param"), [([-1], "tokens.0"), ([1, "2"], "tokens.1"), ([], "tokens"), ([True], "tokens.0")]
)
async def test_detokenize_refuses_what_is_not_a_token_id(tokens: list, param: str) -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/detokenize", json={"model": MODEL, "tokens": tokens})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert backend.queries == []


async def test_tokenize_needs_a_key_when_keys_are_set() -> None:
    async with client_for(FakeBackend(), api_keys=["sk-1"]) as client:
        refused = await client.post("/tokenize", json={"prompt": "a"})
        allowed = await client.post("/tokenize", json={"prompt": "a"}, headers={"Authorization": "Bearer sk-1"})
    assert refused.status_code == 401 and allowed.status_code == 200


# --- /version, /docs ----------------------------------------------------------------------------
async def test_version_is_the_installed_package_version() -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.get("/version")
    assert response.status_code == 200
    assert response.json() == {"version": version("triton-chat")}


def _docs_client(assets: Path | None) -> httpx.AsyncClient:
    app = create_app(settings(), FakeBackend(), docs_assets=assets)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


async def test_docs_page_loads_only_local_assets(tmp_path: Path) -> None:
    (tmp_path / "swagger-ui-bundle.js").write_text("window.SwaggerUIBundle = 1;")
    (tmp_path / "swagger-ui.css").write_text("body {}")
    (tmp_path / "secret.txt").write_text("not an asset")
    async with _docs_client(tmp_path) as client:
        page = await client.get("/docs")
        script = await client.get("/docs/assets/swagger-ui-bundle.js")
        css = await client.get("/docs/assets/swagger-ui.css")
        other = await client.get("/docs/assets/secret.txt")
        outside = await client.get("/docs/assets/..%2Fsecret.txt")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert "/docs/assets/swagger-ui-bundle.js" in sources and "/docs/assets/swagger-ui.css" in sources
    assert all(source.startswith("/") for source in sources), sources
    assert "url: '/openapi.json'" in page.text
    assert script.status_code == 200 and script.text == "window.SwaggerUIBundle = 1;"
    assert script.headers["content-type"].startswith("text/javascript")
    assert css.status_code == 200 and css.text == "body {}"
    assert other.status_code == 404 and outside.status_code == 404


async def test_docs_without_the_assets_is_a_404_that_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("openai_frontend.app.swagger_assets", lambda: None)
    async with _docs_client(None) as client:
        response = await client.get("/docs")
        schema = await client.get("/openapi.json")
    assert response.status_code == 404
    assert "swagger-ui-bundle" in response.json()["error"]["message"]
    assert schema.status_code == 200 and "/tokenize" in schema.json()["paths"]


# --- CORS ---------------------------------------------------------------------------------------
async def test_cors_is_off_by_default() -> None:
    async with client_for(FakeBackend()) as client:
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        answer = await client.get("/v1/models", headers={"Origin": ORIGIN})
    assert preflight.status_code == 405
    assert "access-control-allow-origin" not in preflight.headers
    assert "access-control-allow-origin" not in answer.headers


async def test_a_preflight_from_an_allowed_origin_succeeds_without_a_key() -> None:
    async with client_for(FakeBackend(), allowed_origins=[ORIGIN], api_keys=["sk-1"]) as client:
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        unauthorized = await client.post("/v1/chat/completions", json=chat_body(), headers={"Origin": ORIGIN})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "content-type" in preflight.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in preflight.headers
    # The request itself still needs its key; the browser can read the 401.
    assert unauthorized.status_code == 401
    assert unauthorized.headers["access-control-allow-origin"] == ORIGIN


async def test_a_preflight_from_another_origin_gets_no_cors_headers() -> None:
    async with client_for(FakeBackend(), allowed_origins=[ORIGIN]) as client:
        preflight = await client.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "https://evil.test"})
        answer = await client.get("/v1/models", headers={"Origin": "https://evil.test"})
    assert preflight.status_code == 400
    assert "access-control-allow-origin" not in preflight.headers
    assert "access-control-allow-origin" not in answer.headers


async def test_cors_methods_headers_and_credentials_are_as_configured() -> None:
    overrides = {
        "allowed_origins": [ORIGIN],
        "allowed_methods": ["post"],
        "allowed_headers": ["X-Custom"],
        "allow_credentials": True,
    }
    async with client_for(FakeBackend(), **overrides) as client:
        allowed = await client.options(
            "/tokenize",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "x-custom",
            },
        )
        refused = await client.options("/tokenize", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "PUT"})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-credentials"] == "true"
    assert allowed.headers["access-control-allow-methods"] == "POST"
    assert refused.status_code == 400


def test_credentials_with_any_origin_are_refused() -> None:
    with pytest.raises(ValidationError, match="named origins"):
        settings(allowed_origins=["*"], allow_credentials=True)


# --- X-Request-Id -------------------------------------------------------------------------------
async def test_a_valid_request_id_names_the_answer_and_is_echoed() -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        first = await client.post("/v1/chat/completions", json=chat_body(), headers={"X-Request-Id": "abc-123"})
        second = await client.post("/v1/chat/completions", json=chat_body(), headers={"X-Request-Id": "abc-123"})
    for response in (first, second):
        assert response.headers["x-request-id"] == "abc-123"
        assert response.json()["id"] == "chatcmpl-abc-123"
    # Two requests with one id are still two requests in the model.
    ids = [request.request_id for request in backend.requests]
    assert all(one.startswith("chatcmpl-abc-123-") for one in ids) and len(set(ids)) == 2


@pytest.mark.parametrize("given", [None, "has space", "x" * 129, "line\\nbreak", ""])
async def test_an_absent_or_invalid_request_id_is_replaced(given: str | None) -> None:
    backend = FakeBackend()
    headers = {} if given is None else {"X-Request-Id": given}
    async with client_for(backend) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True), headers=headers)
    generated = response.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    assert f'"id":"chatcmpl-{generated}"' in response.text
    assert [request.request_id for request in backend.requests] == [f"chatcmpl-{generated}"]


async def test_errors_carry_the_request_id_too() -> None:
    async with client_for(FakeBackend(), api_keys=["sk-1"]) as client:
        unauthorized = await client.get("/v1/models", headers={"X-Request-Id": "req-401"})
        missing = await client.get("/nope", headers={"X-Request-Id": "req-404", "Authorization": "Bearer sk-1"})
    assert unauthorized.status_code == 401 and unauthorized.headers["x-request-id"] == "req-401"
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "req-404"
