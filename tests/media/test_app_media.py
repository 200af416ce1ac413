"""Media through the FastAPI app: all five part formats reach the backend as bytes + MIME type;
B8 (media are fetched only after auth and validation, and errors come before any SSE byte);
a stalled fetch does not hold up other requests."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
from media_harness import LEAK, media_settings
from media_net import TestNet
from media_samples import jpeg, mp4, png, wav
from media_servers import body, stall
from starlette.types import Message

from openai_frontend.app import create_app
from openai_frontend.settings import FrontendSettings
from tests.frontend.frontend_fakes import MODEL, FakeBackend

KEY = "sk-media-test"
CAT = png(6, 4, (0, 200, 0))


def client(
    net: TestNet, backend: FakeBackend, root: Path | str = "/nonexistent", **overrides: Any
) -> httpx.AsyncClient:
    media = overrides.pop("media", media_settings(root))
    settings = FrontendSettings(served_model_name=MODEL, media=media, **overrides)
    app = create_app(settings, backend, media_network=net.network())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.AsyncClient(transport=transport, base_url="http://testserver", headers=headers)


def chat(content: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def assert_error(response: httpx.Response, status: int, param: str | None, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert not LEAK.search(error["message"].split("' ", 1)[-1]), error["message"]


FIVE_FORMATS: list[dict[str, Any]] = [
    {"type": "text", "text": "Describe all of these."},
    {"type": "image_url", "image_url": "demo.png"},  # 1: bare string, local path
    {"type": "image_url", "image_url": {"url": "http://allowed.test/cat.png"}},  # 2: {"url"}, http
    {"type": "image_url", "image_url": {"url": "file://sub/inner.jpg"}},  # 3: file://
    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(CAT).decode()}},  # 4
    {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav()).decode(), "format": "wav"}},  # 5
    {"type": "image_url", "image_url": base64.b64encode(jpeg()).decode()},  # 1: bare base64 JPEG
    {"type": "video_url", "video_url": {"url": "movie.mp4"}},
    {"type": "audio_url", "audio_url": "http://allowed.test/clip.wav"},
]
EXPECTED_MEDIA = [
    (png(), "image/png"),
    (CAT, "image/png"),
    (jpeg(), "image/jpeg"),
    (CAT, "image/png"),
    (wav(), "audio/x-wav"),
    (jpeg(), "image/jpeg"),
    (mp4(), "video/mp4"),
    (wav(), "audio/x-wav"),
]
EXPECTED_KINDS = ["image", "image", "image", "image", "audio", "image", "video", "audio"]


def serve_origin(net: TestNet) -> None:
    net.origin.routes["/cat.png"] = body(CAT, "image/png")
    net.origin.routes["/clip.wav"] = body(wav(), "audio/wav")


async def test_all_five_formats_reach_the_backend_as_bytes(net: TestNet, media_root: Path) -> None:
    serve_origin(net)
    backend = FakeBackend()
    async with client(net, backend, media_root) as http:
        response = await http.post("/v1/chat/completions", json=chat(FIVE_FORMATS))
        metrics = (await http.get("/metrics")).text
    assert response.status_code == 200, response.text
    # Two of the parts were fetched from the origin (the others are local files or inline data).
    assert f'media_fetch_total{{model_name="{MODEL}",result="ok"}} 2.0' in metrics
    assert f'media_fetch_bytes_sum{{model_name="{MODEL}"}} {float(len(CAT) + len(wav()))}' in metrics
    [request] = backend.requests
    assert request.media == EXPECTED_MEDIA
    content = request.messages[0]["content"]
    assert content[0] == {"type": "text", "text": "Describe all of these."}
    assert content[1:] == [{"type": kind, "media_index": i} for i, kind in enumerate(EXPECTED_KINDS)]


async def test_streaming_request_gets_its_media_before_the_first_event(net: TestNet, media_root: Path) -> None:
    serve_origin(net)
    backend = FakeBackend()
    async with client(net, backend, media_root) as http:
        response = await http.post("/v1/chat/completions", json=chat(FIVE_FORMATS, stream=True))
    assert response.status_code == 200 and response.text.rstrip().endswith("data: [DONE]")
    assert backend.requests[0].media == EXPECTED_MEDIA


async def test_media_error_on_a_stream_is_a_plain_400_before_any_sse_byte(net: TestNet, media_root: Path) -> None:
    backend = FakeBackend()
    content: list[dict[str, Any]] = [
        {"type": "text", "text": "x"},
        {"type": "image_url", "image_url": {"url": "http://allowed.test/gone.png"}},
    ]
    async with client(net, backend, media_root) as http:
        response = await http.post("/v1/chat/completions", json=chat(content, stream=True))
        metrics = (await http.get("/metrics")).text
    assert_error(response, 400, "messages.0.content.1.image_url", "media_fetch_failed")
    assert backend.requests == []
    assert f'media_fetch_total{{model_name="{MODEL}",result="media_fetch_failed"}} 1.0' in metrics


async def test_unauthenticated_request_never_fetches(net: TestNet) -> None:
    """B8: 401 and 0 origin hits, 0 lookups; the same request with the key does fetch."""
    serve_origin(net)
    backend = FakeBackend()
    content = [{"type": "image_url", "image_url": "http://allowed.test/cat.png"}]
    async with client(net, backend, api_keys=[KEY]) as http:
        for headers in ({"Authorization": "Bearer wrong"}, {"Authorization": ""}):
            response = await http.post("/v1/chat/completions", json=chat(content), headers=headers)
            assert_error(response, 401, None, "invalid_api_key")
        assert net.origin.hits == 0 and net.resolutions == [] and net.dials == []
        assert (await http.post("/v1/chat/completions", json=chat(content))).status_code == 200
    assert net.origin.hits == 1


async def test_invalid_requests_never_fetch(net: TestNet) -> None:
    """B8: schema, parameter and model errors are answered before any media I/O."""
    serve_origin(net)
    media = [{"type": "image_url", "image_url": {"url": "http://allowed.test/cat.png"}}]
    bad_second_message = chat(media)
    bad_second_message["messages"].append({"role": "", "content": "x"})
    cases = [
        (chat(media, temperature="hot"), 400, "temperature"),
        (chat(media, top_p=7), 400, "top_p"),
        ({**chat(media), "model": "no-such-model"}, 404, "model"),
        (bad_second_message, 400, "messages.1.role"),
        (chat(media, n=2, temperature=0), 400, None),
    ]
    backend = FakeBackend()
    async with client(net, backend) as http:
        for payload, status, param in cases:
            response = await http.post("/v1/chat/completions", json=payload)
            assert response.status_code == status, response.text
            if param is not None:
                assert response.json()["error"]["param"] == param
    assert net.origin.hits == 0 and net.resolutions == [] and net.dials == []
    assert backend.requests == []


async def test_media_errors_name_the_part_and_leak_nothing(net: TestNet, media_root: Path) -> None:
    backend = FakeBackend()
    cases = [
        ("http://127.0.0.1/a.png", "media_not_allowed"),
        ("http://inward.allowed.test/a.png", "media_not_allowed"),
        ("../../etc/passwd", "media_not_allowed"),
        ("nope.png", "media_unavailable"),
        ("data:image/png;base64," + base64.b64encode(b"<html>").decode(), "invalid_media"),
    ]
    async with client(net, backend, media_root) as http:
        for value, code in cases:
            content = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": value}]
            response = await http.post("/v1/chat/completions", json=chat(content))
            assert_error(response, 400, "messages.0.content.1.image_url", code)
            assert str(media_root) not in response.text
    assert backend.requests == [] and net.canary_hits() == 0


async def test_a_stalled_fetch_does_not_hold_up_other_requests(net: TestNet) -> None:
    arrived = asyncio.Event()
    net.origin.routes["/stalled.png"] = stall(arrived)
    backend = FakeBackend()
    media = media_settings(fetch_timeout_s=5.0)
    async with client(net, backend, media=media) as http:
        content = [{"type": "image_url", "image_url": "http://allowed.test/stalled.png"}]
        stalled = asyncio.ensure_future(http.post("/v1/chat/completions", json=chat(content)))
        await asyncio.wait_for(arrived.wait(), 5.0)
        latencies = []
        for _ in range(50):
            started = time.perf_counter()
            assert (await http.get("/health")).status_code == 200
            latencies.append(time.perf_counter() - started)
        assert not stalled.done()
        response = await stalled
    assert_error(response, 400, "messages.0.content.0.image_url", "media_timeout")
    # A request held up by the stalled fetch would wait for its 5 s timeout; one that was not
    # answers in milliseconds, or a few hundred on a machine busy with other work.
    assert max(latencies) < 1.0


async def test_client_leaving_during_a_fetch_cancels_it(net: TestNet) -> None:
    # Driven as raw ASGI: httpx's transport cannot leave in the middle of a request.
    net.origin.routes["/stalled.png"] = stall()
    backend = FakeBackend()
    settings = FrontendSettings(served_model_name=MODEL, media=media_settings(fetch_timeout_s=30.0))
    app = create_app(settings, backend, media_network=net.network())
    raw = json.dumps(chat([{"type": "image_url", "image_url": "http://allowed.test/stalled.png"}])).encode()
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"", "headers": []}
    incoming = [{"type": "http.request", "body": raw, "more_body": False}]
    gone = asyncio.Event()
    sent: list[Message] = []

    async def receive() -> Message:
        if incoming:
            return incoming.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    task = asyncio.create_task(app(scope, receive, send))
    while not net.origin.requests:
        await asyncio.sleep(0.01)
    started = time.monotonic()
    gone.set()
    await asyncio.wait_for(task, 5)
    assert time.monotonic() - started < 1.0
    assert sent[0]["status"] == 499 and backend.requests == []
