"""The served OpenAPI document is the contract: the ranges it gives are the ones enforced, and it
lists only statuses the server sends, each with the error envelope."""

from __future__ import annotations

from typing import Any

import pytest
from frontend_fakes import FakeBackend, chat_body, choice_deltas, client_for, interleave

from openai_frontend.client.base import BackendError, BackendRequest
from python_backend.protocol.contract import ChoiceDelta


def one_token_each(req: BackendRequest) -> list[ChoiceDelta | BackendError]:
    n = int(req.parameters.get("n") or 1)
    return list(interleave(*(choice_deltas(k, ["x"], batch=n) for k in range(n))))


async def served_schema() -> dict[str, Any]:
    async with client_for(FakeBackend()) as client:
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    return response.json()


def field_schema(spec: dict[str, Any], name: str) -> dict[str, Any]:
    body = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    (typed,) = [item for item in body["properties"][name]["anyOf"] if item["type"] != "null"]
    return typed


@pytest.mark.parametrize(
    "name",
    [
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "max_tokens",
        "min_tokens",
        "n",
        "best_of",
        "top_logprobs",
    ],
)
async def test_each_documented_bound_is_the_enforced_one(name: str) -> None:
    typed = field_schema(await served_schema(), name)
    step = 1 if typed["type"] == "integer" else 1e-3
    inside: list[float] = []
    outside: list[float] = []
    if "minimum" in typed:
        inside.append(typed["minimum"])
        outside.append(typed["minimum"] - step)
    if "exclusiveMinimum" in typed:
        inside.append(typed["exclusiveMinimum"] + step / 1000 if step < 1 else typed["exclusiveMinimum"] + 1)
        outside.append(typed["exclusiveMinimum"])
    if "maximum" in typed:
        inside.append(typed["maximum"])
        outside.append(typed["maximum"] + step)
    assert outside, f"{name} documents no range"
    extra = {"temperature": 1} if name in ("n", "best_of") else {}
    if name == "min_tokens":
        extra = {"max_tokens": 2**31 - 1}
    backend = FakeBackend(script=one_token_each)
    async with client_for(backend) as client:
        for value in outside:
            response = await client.post("/v1/chat/completions", json=chat_body(**{**extra, name: value}))
            assert response.status_code == 400, (name, value)
            assert response.json()["error"]["param"] == name
        for value in inside:
            response = await client.post("/v1/chat/completions", json=chat_body(**{**extra, name: value}))
            assert response.status_code == 200, (name, value, response.text)


async def test_stop_token_ids_document_the_int32_range() -> None:
    typed = field_schema(await served_schema(), "stop_token_ids")
    assert typed["items"] == {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
    assert field_schema(await served_schema(), "seed")["maximum"] == 2**64 - 1  # exact, not a float


async def test_no_operation_documents_fastapis_422_and_every_error_has_the_envelope() -> None:
    spec = await served_schema()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            statuses = set(operation["responses"])
            assert "422" not in statuses, (path, method)
            assert {"400", "408", "413", "431", "503"} <= statuses, (path, method)
            for status, answer in operation["responses"].items():
                if int(status) >= 400:
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorEnvelope"}, (path, method, status)
