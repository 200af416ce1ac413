"""API keys (deny by default), health probes, and the model list."""

from __future__ import annotations

import inspect

import pytest
from frontend_fakes import MODEL, FakeBackend, chat_body, client_for

from openai_frontend.http import auth

KEY = "sk-test-1"
GOOD = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/tiny-chat"),
        ("GET", "/openapi.json"),
        ("GET", "//v1/models"),
        ("GET", "/V1/models"),
        ("GET", "/health/"),
        ("GET", "/health/../v1/models"),
        ("HEAD", "/v1/chat/completions"),
        ("OPTIONS", "/v1/chat/completions"),
        ("GET", "/does-not-exist"),
    ],
)
async def test_every_other_route_needs_a_key(method: str, path: str) -> None:
    backend = FakeBackend()
    async with client_for(backend, api_keys=[KEY, "sk-other"]) as client:
        response = await client.request(method, path, json=chat_body() if method == "POST" else None)
    assert response.status_code == 401
    if method != "HEAD":
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert backend.requests == []


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer sk-wrong"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": f"Bearer {KEY.upper()}"},
        {"Authorization": KEY},
        {"X-Api-Key": KEY},
    ],
)
async def test_bad_credentials_are_401(headers: dict) -> None:
    async with client_for(FakeBackend(), api_keys=[KEY]) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(), headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


async def test_valid_keys_pass_and_probes_are_open() -> None:
    async with client_for(FakeBackend(), api_keys=[KEY, "sk-other"]) as client:
        chat = await client.post("/v1/chat/completions", json=chat_body(), headers=GOOD)
        other = await client.get("/v1/models", headers={"Authorization": "bearer sk-other"})
        live = await client.get("/health")
        ready = await client.get("/health/ready")
    assert chat.status_code == 200
    assert other.status_code == 200
    assert live.status_code == 200 and ready.status_code == 200


def test_keys_are_compared_in_constant_time() -> None:
    assert "hmac.compare_digest" in inspect.getsource(auth)
    assert auth.key_matches(b"a", [b"b", b"a"])
    assert not auth.key_matches(b"a", [b"b"])


async def test_health_and_readiness() -> None:
    backend = FakeBackend(ready=True)
    async with client_for(backend) as client:
        live = await client.get("/health")
        ready = await client.get("/health/ready")
        backend.ready = False
        live_again = await client.get("/health")
        unready = await client.get("/health/ready")
    assert live.status_code == 200 and live.json() == {"status": "ok"}
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert live_again.status_code == 200
    assert unready.status_code == 503
    assert unready.headers["retry-after"] == "1"
    assert unready.json()["error"]["code"] == "backend_not_ready"


async def test_model_list_and_retrieve() -> None:
    async with client_for(FakeBackend()) as client:
        listing = await client.get("/v1/models")
        one = await client.get("/v1/models/tiny-lora")
        missing = await client.get("/v1/models/nope")
    body = listing.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL, "tiny-lora"]
    assert all(m["object"] == "model" and m["owned_by"] == "triton-chat" for m in body["data"])
    assert one.json()["parent"] == MODEL
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


async def test_openapi_documents_the_chat_body() -> None:
    # /docs itself is tested in test_operations (with and without the Swagger UI assets).
    async with client_for(FakeBackend()) as client:
        spec = await client.get("/openapi.json")
    assert spec.status_code == 200
    operation = spec.json()["paths"]["/v1/chat/completions"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "messages", "temperature", "n"} <= set(schema["properties"])


@pytest.mark.parametrize("second", [f"Bearer {KEY}", "Bearer sk-wrong", "Basic abc"])
async def test_two_authorization_headers_are_a_400(second: str) -> None:
    backend = FakeBackend()
    headers = [("Authorization", f"Bearer {KEY}"), ("Authorization", second)]
    async with client_for(backend, api_keys=[KEY]) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(), headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "duplicate_header" and "Authorization" in error["message"]
    assert backend.requests == []
