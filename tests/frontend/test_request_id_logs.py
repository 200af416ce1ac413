"""``--log-format json``: every line logged while a request is handled carries its request id."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest
from frontend_fakes import FakeBackend, chat_body, client_for

from openai_frontend.client.base import BackendRequest
from openai_frontend.launcher.log_format import uvicorn_log_config
from python_backend.protocol.contract import ChoiceDelta

_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "openai_frontend")


class BrokenMidAnswer(FakeBackend):
    """Sends one token, then fails with an error the frontend does not expect (so it logs it)."""

    def generate(self, req: BackendRequest) -> AsyncGenerator[ChoiceDelta, None]:
        return self._broken(req)

    async def _broken(self, req: BackendRequest) -> AsyncGenerator[ChoiceDelta, None]:
        self.requests.append(req)
        yield ChoiceDelta(0, text="Hel", num_input_tokens=3)
        raise RuntimeError("the answer could not be decoded")


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The frontend's loggers configured as ``--log-format json`` does, writing into a buffer."""
    config = uvicorn_log_config("json")
    assert config is not None
    stream = io.StringIO()
    config["handlers"]["json"]["stream"] = stream
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    saved = [(one, one.handlers[:], one.level, one.propagate, one.filters[:]) for one in loggers]
    logging.config.dictConfig(config)
    try:
        yield stream
    finally:
        for one, handlers, level, propagate, filters in saved:
            one.handlers, one.propagate, one.filters = handlers, propagate, filters
            one.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_the_lines_of_a_request_carry_its_id_and_others_none(json_log: io.StringIO) -> None:
    async with client_for(BrokenMidAnswer()) as client:
        streamed = await client.post(
            "/v1/chat/completions", json=chat_body(stream=True), headers={"X-Request-Id": "client-id.42"}
        )
        logging.getLogger("openai_frontend.chat").warning("between two requests")
        whole = await client.post("/v1/chat/completions", json=chat_body())
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")  # its error ending sent
    assert whole.status_code == 500
    generated = whole.headers["x-request-id"]
    lines = _lines(json_log)
    assert [(line["message"], line.get("request_id")) for line in lines] == [
        ("stream failed", "client-id.42"),
        ("between two requests", None),
        ("unhandled error on POST /v1/chat/completions", generated),
    ]
    assert "the answer could not be decoded" in lines[0]["exception"]
