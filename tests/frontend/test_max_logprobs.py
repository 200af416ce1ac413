"""--max-logprobs in the frontend: the ceiling of top_logprobs, logprobs and prompt_logprobs."""

from __future__ import annotations

from typing import Any

import pytest
from frontend_fakes import MODEL, FakeBackend, client_for
from test_request_errors import assert_envelope

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": MODEL, "prompt": "hi"}


async def _post(path: str, payload: dict[str, Any], **overrides: Any) -> tuple[Any, FakeBackend]:
    backend = FakeBackend()
    async with client_for(backend, openai_mode="openai", **overrides) as client:
        return await client.post(path, json=payload), backend


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 4}, "top_logprobs"),
        ("/v1/chat/completions", {"prompt_logprobs": 4}, "prompt_logprobs"),
        ("/v1/completions", {"logprobs": 4}, "logprobs"),
        ("/v1/completions", {"prompt_logprobs": 4}, "prompt_logprobs"),
    ],
)
async def test_a_request_over_the_ceiling_is_a_400_naming_field_and_ceiling(
    path: str, fields: dict[str, Any], param: str
) -> None:
    base = CHAT if "chat" in path else COMPLETION
    response, backend = await _post(path, {**base, **fields}, max_logprobs=3)
    assert_envelope(response, 400, param)
    assert "[0, 3]" in response.json()["error"]["message"]
    assert backend.requests == []


@pytest.mark.parametrize(
    ("path", "fields"), [("/v1/chat/completions", {"top_logprobs": 30}), ("/v1/completions", {"logprobs": 30})]
)
async def test_a_higher_ceiling_lets_more_through(path: str, fields: dict[str, Any]) -> None:
    base = CHAT if "chat" in path else COMPLETION
    refused, _ = await _post(path, {**base, **fields})
    assert refused.status_code == 400 and "[0, 20]" in refused.json()["error"]["message"]
    accepted, backend = await _post(path, {**base, **fields}, max_logprobs=30)
    assert accepted.status_code == 200, accepted.text
    assert backend.requests[0].parameters["top_logprobs"] == 30
