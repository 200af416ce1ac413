"""B4: size caps hold while streaming, with scaled-down caps (1 MiB and the like).

Bytes are counted where the fetcher reads them (the test dialer's connection), so "read" means
what crossed into the process: rejected after at most cap + 64 KiB. Also: memory stays near the
cap, nothing is written to disk, the per-request total holds across concurrent items, and every
kind has its own cap (base64 audio its own, checked before decoding).
"""

from __future__ import annotations

import base64
import os
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from media_harness import load, media_settings, refusal
from media_net import TestNet
from media_samples import noisy_png, png, wav
from media_servers import Handler, body, gzip_bomb, lying_length, stream

from openai_frontend.media.loader import MediaLoader
from openai_frontend.media.parts import extract_media
from openai_frontend.media.policy import MediaSettings
from python_backend.protocol.errors import ContractError

CAP = 1024 * 1024
SLACK = 64 * 1024
HEAD = 1024  # the origin's status line and headers


def settings(**overrides: object) -> MediaSettings:
    return media_settings(max_image_bytes=CAP, **overrides)


@pytest.mark.parametrize(
    ("path", "handler", "code"),
    [
        ("/honest-oversize", body(b"\x89PNG" + b"\x00" * (2 * CAP), "image/png"), "media_too_large"),
        ("/chunked-endless", stream({"Content-Type": "image/png"}, b"\x89PNG" * 8192, chunked=True), "media_too_large"),
        ("/close-delimited-endless", stream({"Connection": "close"}, b"\x00" * 65536), "media_too_large"),
        ("/length-says-small-sends-more", lying_length(1000, png() + b"\x00" * (2 * CAP)), "invalid_media"),
        ("/length-says-more-sends-less", lying_length(CAP - 1, png()), "media_fetch_failed"),
        ("/gzip-bomb", gzip_bomb(64 * CAP), "invalid_media"),
        ("/gzip-bomb-chunked", gzip_bomb(16 * CAP, chunked=True), "invalid_media"),
    ],
)
async def test_cap_holds_while_streaming(net: TestNet, path: str, handler: Handler, code: str) -> None:
    net.origin.routes[path] = handler
    info = await refusal(settings(), net.network(), f"http://allowed.test{path}")
    assert info.code == code
    assert net.bytes_read <= CAP + SLACK + HEAD, net.bytes_read
    if path in ("/honest-oversize", "/gzip-bomb", "/gzip-bomb-chunked"):
        assert net.bytes_read <= SLACK + HEAD  # refused on the headers, before the body


async def test_memory_of_a_refused_endless_download_stays_near_the_cap(net: TestNet) -> None:
    # Big enough that the fixed buffers (h11, asyncio, the in-process fixture server) stay small
    # next to it; tracemalloc sees both ends of the connection.
    cap = 16 * CAP
    net.origin.routes["/endless"] = stream({}, b"\x89PNG" * 16384, chunked=True)
    tracemalloc.start()
    try:
        await refusal(media_settings(max_image_bytes=cap), net.network(), "http://allowed.test/endless")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= cap * 1.2, peak / cap  # measured about 1.04


async def test_no_temporary_files_are_left(net: TestNet) -> None:
    before = set(os.listdir(tempfile.gettempdir()))
    net.origin.routes["/ok.png"] = body(png(), "image/png")
    net.origin.routes["/endless"] = stream({}, b"\x00" * 65536)
    await load(settings(), net.network(), "http://allowed.test/ok.png")
    await refusal(settings(), net.network(), "http://allowed.test/endless")
    assert set(os.listdir(tempfile.gettempdir())) == before  # media stay in memory, never on disk


async def test_request_total_holds_across_concurrent_items(net: TestNet) -> None:
    image = noisy_png(330)  # about 330 KB each
    assert 300_000 < len(image) < CAP
    net.origin.fallback = body(image, "image/png")
    content = [{"type": "image_url", "image_url": f"http://allowed.test/{i}.png"} for i in range(3)]
    tight = settings(max_request_bytes=2 * len(image) + 10)
    parsed = extract_media([{"role": "user", "content": content}], tight)
    with pytest.raises(ContractError) as caught:
        await MediaLoader(tight, net.network()).load(parsed.refs)
    assert caught.value.info.code == "media_too_large"
    assert "total" in caught.value.info.message
    loose = settings(max_request_bytes=3 * len(image))
    parsed = extract_media([{"role": "user", "content": content}], loose)
    assert len(await MediaLoader(loose, net.network()).load(parsed.refs)) == 3


async def test_each_kind_has_its_own_cap(net: TestNet) -> None:
    net.origin.routes["/a.wav"] = body(wav(seconds=0.5), "audio/x-wav")  # 8 KB
    small = media_settings(max_audio_bytes=4096, max_image_bytes=CAP)
    assert (await refusal(small, net.network(), "http://allowed.test/a.wav", "audio_url")).code == "media_too_large"
    assert await load(media_settings(max_audio_bytes=16384), net.network(), "http://allowed.test/a.wav", "audio_url")


async def test_base64_audio_cap_is_separate_and_checked_before_decoding(net: TestNet) -> None:
    clip = wav(seconds=0.5)
    encoded = base64.b64encode(clip).decode()
    tight = media_settings(max_base64_audio_bytes=4096, max_audio_bytes=CAP)
    info = await refusal(tight, net.network(), {"data": encoded, "format": "wav"}, "input_audio")
    assert info.code == "media_too_large"
    info = await refusal(tight, net.network(), f"data:audio/wav;base64,{encoded}", "audio_url")
    assert info.code == "media_too_large"
    [(data, mime)] = await load(media_settings(), net.network(), {"data": encoded, "format": "wav"}, "input_audio")
    assert (data, mime) == (clip, "audio/x-wav")


async def test_local_file_over_the_cap(net: TestNet, media_root: Path) -> None:
    (media_root / "big.png").write_bytes(noisy_png(64))
    info = await refusal(media_settings(media_root, max_image_bytes=1000), net.network(), "big.png")
    assert info.code == "media_too_large"
