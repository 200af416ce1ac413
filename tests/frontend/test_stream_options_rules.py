"""``stream_options`` without ``stream: true``: OpenAI's and vLLM's 400, on both generation routes.

vLLM answers "Stream options can only be defined when `stream=True`." and OpenAI a 400 naming
``stream_options``; this server does the same in either mode (MindIE mode otherwise ignores the
field, and names it in ``x-ignored-params``). A null ``stream_options`` is an absent one.
"""

from __future__ import annotations

from typing import Any

import pytest
from frontend_fakes import MODEL, FakeBackend, chat_body, client_for
from test_request_errors import assert_envelope

ROUTES = {
    "/v1/chat/completions": chat_body,
    "/v1/completions": lambda **fields: {"model": MODEL, "prompt": "Once upon", **fields},
}
MODES = ["openai", "vllm"]  # "vllm" is MindIE mode, the default


async def post(path: str, mode: str, **fields: Any) -> tuple[Any, FakeBackend]:
    backend = FakeBackend()
    async with client_for(backend, openai_mode=mode) as client:
        return await client.post(path, json=ROUTES[path](**fields)), backend


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("stream", [None, False])
@pytest.mark.parametrize("options", [{"include_usage": True}, {}])
async def test_stream_options_without_stream_is_a_400_naming_it(
    path: str, mode: str, stream: bool | None, options: dict[str, Any]
) -> None:
    fields: dict[str, Any] = {"stream_options": options}
    if stream is not None:
        fields["stream"] = stream
    response, backend = await post(path, mode, **fields)
    error = assert_envelope(response, 400, "stream_options")
    assert error["type"] == "invalid_request_error"
    assert "'stream' is true" in error["message"]
    assert backend.requests == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ROUTES)
async def test_null_stream_options_is_absent(path: str, mode: str) -> None:
    response, backend = await post(path, mode, stream_options=None)
    assert response.status_code == 200, response.text
    assert "x-ignored-params" not in response.headers
    assert len(backend.requests) == 1


@pytest.mark.parametrize("path", ROUTES)
async def test_mindie_mode_still_ignores_them_on_a_stream(path: str) -> None:
    response, _ = await post(path, "vllm", stream=True, stream_options={"include_usage": True})
    assert response.status_code == 200, response.text
    assert response.headers["x-ignored-params"] == "stream_options"
