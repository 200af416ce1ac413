"""HTTP limits on a real uvicorn socket: oversized or too many headers are a 431, requests that do
not arrive in time a 408, the connection cap a 503, parser errors a 400, each in the envelope and
each closing its connection, while well-behaved requests and long streams go on."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from frontend_fakes import FakeBackend, chat_body, settings

from openai_frontend.app import create_app
from openai_frontend.launcher.draining_server import DrainingServer, draining_server

HEADER_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.5
WAIT_S = 10.0  # an answer that takes this long is a failure


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    error: dict[str, Any]
    closed: bool  # the server closed the connection after the answer


@dataclass
class Running:
    server: DrainingServer
    port: int
    backend: FakeBackend

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@asynccontextmanager
async def serving(backend: FakeBackend | None = None, **overrides: Any) -> AsyncIterator[Running]:
    limits: dict[str, Any] = {"header_timeout_s": HEADER_TIMEOUT_S, "body_timeout_s": BODY_TIMEOUT_S}
    fake = backend or FakeBackend()
    app = create_app(settings(**{**limits, **overrides}), fake)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = draining_server(app, "127.0.0.1", listener.getsockname()[1], None, 0)
    server.config.log_level = "warning"
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield Running(server, listener.getsockname()[1], fake)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT_S)
        listener.close()


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One whole response, then whether the connection closed after it."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), WAIT_S)
    closed = await asyncio.wait_for(reader.read(1), WAIT_S) == b""
    error = json.loads(body)["error"] if headers.get("content-type") == "application/json" else {}
    return Answer(int(status_line.split(" ")[1]), headers, error, closed)


def chat_request(body: bytes, content_length: int | None = None, extra: str = "") -> bytes:
    length = len(body) if content_length is None else content_length
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + body


async def test_an_oversized_header_is_a_431_before_it_is_all_sent() -> None:
    async with serving(max_header_bytes=8192) as running:
        reader, writer = await running.connect()
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(64):  # 4 MiB offered; the answer comes after the first few KiB
                writer.write(b"a" * 65536)
                await writer.drain()
        except ConnectionError:
            pass  # the server closed while we were still sending: expected
        answer = await read_answer(reader)
        writer.close()
    assert answer.status == 431 and answer.error["code"] == "headers_too_large" and answer.closed


async def test_headers_just_over_the_limit_in_one_packet_are_a_431() -> None:
    async with serving(max_header_bytes=8192) as running:
        reader, writer = await running.connect()
        writer.write(chat_request(json.dumps(chat_body()).encode(), extra=f"X-Big: {'a' * 9000}\r\n"))
        answer = await read_answer(reader)
        writer.close()
    assert answer.status == 431 and answer.closed
    assert running.backend.requests == []


async def test_too_many_header_fields_are_a_431() -> None:
    async with serving(max_headers=20) as running:
        reader, writer = await running.connect()
        fields = "".join(f"X-F{i}: v\r\n" for i in range(30))
        writer.write(f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode())
        answer = await read_answer(reader)
        writer.close()
    assert answer.status == 431 and "header fields" in answer.error["message"] and answer.closed


async def test_partial_headers_or_nothing_sent_get_a_408_and_the_close() -> None:
    async with serving() as running:
        partial_reader, partial = await running.connect()
        partial.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        silent_reader, silent = await running.connect()
        answers = await asyncio.gather(read_answer(partial_reader), read_answer(silent_reader))
        partial.close()
        silent.close()
    for answer in answers:
        assert answer.status == 408 and answer.error["code"] == "request_timeout" and answer.closed
        assert "headers" in answer.error["message"]


async def test_a_stalled_body_gets_a_408_and_the_close() -> None:
    async with serving() as running:
        reader, writer = await running.connect()
        body = json.dumps(chat_body()).encode()
        writer.write(chat_request(body[:10], content_length=len(body)))
        answer = await read_answer(reader)
        writer.close()
    assert answer.status == 408 and "body" in answer.error["message"] and answer.closed
    assert running.backend.requests == []


async def test_an_invalid_request_is_a_400_in_the_envelope() -> None:
    async with serving() as running:
        reader, writer = await running.connect()
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        answer = await read_answer(reader)
        writer.close()
    assert answer.status == 400 and answer.error["code"] == "invalid_http_request" and answer.closed
    assert answer.headers["content-type"] == "application/json"


async def test_the_connection_cap_answers_503_and_frees_up() -> None:
    async with serving(max_connections=2) as running:
        _, idle = await running.connect()
        reader, writer = await running.connect()
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert first.startswith(b"HTTP/1.1 200")  # two connections: within the cap
        _, third = await running.connect()
        over_reader, over = await running.connect()
        over.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        refused = await read_answer(over_reader)
        for connection in (idle, writer, third, over):
            connection.close()
            await connection.wait_closed()
        async with httpx.AsyncClient(base_url=running.url) as client:
            after = await client.get("/v1/models")
    assert refused.status == 503 and refused.error["code"] == "too_many_connections"
    assert refused.headers["retry-after"] == "1" and refused.closed
    assert after.status_code == 200


async def test_slow_clients_do_not_hold_up_others_and_long_streams_are_not_cut() -> None:
    # A stream that lasts several header timeouts, beside slowloris sockets.
    backend = FakeBackend(delay_s=HEADER_TIMEOUT_S / 2)
    async with serving(backend) as running:
        slow = [await running.connect() for _ in range(20)]
        for _, writer in slow:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-")
        async with httpx.AsyncClient(base_url=running.url, timeout=WAIT_S) as client:
            stream = await client.post("/v1/chat/completions", json=chat_body(stream=True))
            again = await client.post("/v1/chat/completions", json=chat_body())  # same connection, later
        answers = await asyncio.gather(*(read_answer(reader) for reader, _ in slow))
        for _, writer in slow:
            writer.close()
    assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
    assert again.status_code == 200
    assert {answer.status for answer in answers} == {408}


async def test_the_header_deadline_restarts_for_the_next_request_on_a_connection() -> None:
    async with serving() as running:
        reader, writer = await running.connect()
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHo")  # the next request never completes
        answer = await read_answer(reader)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert answer.status == 408 and answer.closed


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured(*names: str) -> Iterator[list[logging.LogRecord]]:
    """Every record of these loggers at INFO and above (uvicorn's do not reach the root logger)."""
    handler = _Records()
    loggers = [logging.getLogger(name) for name in names]
    levels = [one.level for one in loggers]
    for one in loggers:
        one.addHandler(handler)
        one.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        for one, level in zip(loggers, levels, strict=True):
            one.removeHandler(handler)
            one.setLevel(level)


async def test_refusals_log_one_line_of_ours_and_no_uvicorn_warning() -> None:
    with captured("uvicorn.error", "openai_frontend.http.limits") as records:
        async with serving(max_header_bytes=8192, max_connections=1) as running:
            reader, writer = await running.connect()
            writer.write(chat_request(json.dumps(chat_body()).encode(), extra=f"X-Big: {'a' * 9000}\r\n"))
            too_large = await read_answer(reader)
            writer.close()
            await writer.wait_closed()
            _, idle = await running.connect()
            over_reader, over = await running.connect()
            over.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            capped = await read_answer(over_reader)
            for connection in (idle, over):
                connection.close()
    assert (too_large.status, capped.status) == (431, 503)
    messages = [(record.name, record.levelno, record.getMessage()) for record in records]
    assert not [m for m in messages if "Invalid HTTP request" in m[2]], messages
    ours = [(level, message) for name, level, message in messages if name == "openai_frontend.http.limits"]
    assert [(level, message.split(" ")[1]) for level, message in ours] == [
        (logging.INFO, "431"),
        (logging.WARNING, "503"),
    ], ours
