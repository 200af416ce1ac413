"""B6: content validation. Magic bytes must match the declared type; image size is read from the
header before Pillow decodes anything; degenerate, truncated, polyglot and foreign files are 400
within 50 ms and without memory growth; audio headers may not declare absurd durations."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import psutil
import pytest
from media_harness import assert_clean, load, media_settings, refusal
from media_net import TestNet
from media_samples import (
    VALID,
    avi,
    fits,
    flac,
    gif_huge_frames,
    jpeg,
    jpeg_with_size,
    mp3,
    mp4,
    png,
    png_header_only,
    wav,
    wav_raw,
    wmv,
    zip_bytes,
)
from media_servers import body

import openai_frontend.media.sniff as sniff
from openai_frontend.media.errors import MediaError
from openai_frontend.media.formats import JPEG, PNG, format_for_mime
from openai_frontend.media.sniff import check_content

PART_OF = {"image": "image_url", "video": "video_url", "audio": "audio_url"}


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


HOSTILE: dict[str, tuple[str, bytes]] = {
    "png-10000x10000-header-only": ("image/png", png_header_only(10000, 10000)),
    "png-40000x40000-header-only": ("image/png", png_header_only(40000, 40000)),
    "jpeg-65500x65500-sof": ("image/jpeg", jpeg_with_size(65500, 65500)),
    "png-0xN": ("image/png", png_header_only(0, 64)),
    "png-Nx0": ("image/png", png_header_only(64, 0)),
    "png-1x1": ("image/png", png(1, 1)),
    "png-1x300": ("image/png", png(1, 300)),
    "png-2x1000-aspect": ("image/png", png(2, 1000)),
    "jpeg-truncated": ("image/jpeg", jpeg(64, 64)[:300]),
    "jpeg-header-only": ("image/jpeg", jpeg()[:20]),
    "png-truncated": ("image/png", png(64, 64)[:-20]),
    "png-header-plus-zip": ("image/png", png()[:33] + zip_bytes()),
    "png-then-zip": ("image/png", png() + zip_bytes()),
    "zip-as-png": ("image/png", zip_bytes()),
    "fits-as-png": ("image/png", fits()),
    "gif-huge-frames-as-png": ("image/png", gif_huge_frames()),
    "jpeg-declared-png": ("image/png", jpeg()),
    "png-declared-jpeg": ("image/jpeg", png()),
    "mp4-in-image-part": ("image/png", mp4()),
    "html-as-png": ("image/png", b"<html><body>hi</body></html>"),
    "empty": ("image/png", b""),
    "wav-huge-duration": ("audio/x-wav", wav_raw(rate=1000, byte_rate=1000, align=1, data_size=20000, actual=20000)),
    "wav-byte-rate-lie": ("audio/x-wav", wav_raw(rate=8000, byte_rate=1, align=1, data_size=800, actual=800)),
    "wav-data-past-end": ("audio/x-wav", wav_raw(rate=8000, byte_rate=8000, align=1, data_size=0xFFFFFF00, actual=64)),
    "wav-rate-zero": ("audio/x-wav", wav_raw(rate=0, byte_rate=0, align=1, data_size=8, actual=8)),
    "flac-huge-duration": ("audio/flac", flac(total_samples=(1 << 36) - 1, rate=1)),
    "flac-rate-zero": ("audio/flac", flac(total_samples=10, rate=0)),
    "mp3-tag-only": ("audio/mpeg", b"ID3\x04\x00\x00\x00\x00\x01\x00" + b"\x00" * 128),
    "wav-declared-mp3": ("audio/mpeg", wav()),
    "png-in-audio-part": ("audio/mpeg", png()),
    "mp4-ftyp-too-big": ("video/mp4", b"\x00\x01\x00\x00ftypisom" + b"\x00" * 32),
    "avi-without-hdrl": ("video/x-msvideo", b"RIFF\x10\x00\x00\x00AVI JUNKJUNK"),
    "wmv-header-size-lie": ("video/x-ms-wmv", wmv()[:16] + (10**9).to_bytes(8, "little") + b"\x00" * 8),
}

SETTINGS = media_settings(max_audio_seconds=10.0)


@pytest.mark.parametrize(("mime", "data"), list(VALID.items()), ids=list(VALID))
def test_valid_samples_pass_with_their_canonical_type(mime: str, data: bytes) -> None:
    fmt = format_for_mime(mime)
    assert fmt is not None
    assert check_content(data, fmt.kind, [fmt], SETTINGS).mime == mime


@pytest.mark.parametrize(("mime", "data"), list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_file_is_refused_fast(mime: str, data: bytes) -> None:
    fmt = format_for_mime(mime)
    assert fmt is not None
    started = time.perf_counter()
    with pytest.raises(MediaError) as caught:
        check_content(data, fmt.kind, [fmt], SETTINGS)
    # Refused from its header, not decoded: decoding one of these takes seconds and gigabytes. The
    # bound leaves room for a busy machine.
    assert time.perf_counter() - started <= 1.0
    assert_clean(caught.value.to_contract_error("messages.0.content.1.image_url").info)


def test_hostile_files_do_not_grow_memory() -> None:
    process = psutil.Process()
    for mime, data in HOSTILE.values():  # warm-up: Pillow plugins, caches
        fmt = format_for_mime(mime)
        assert fmt is not None
        with pytest.raises(MediaError):
            check_content(data, fmt.kind, [fmt], SETTINGS)
    before = process.memory_info().rss
    for _ in range(5):
        for mime, data in HOSTILE.values():
            fmt = format_for_mime(mime)
            assert fmt is not None
            with pytest.raises(MediaError):
                check_content(data, fmt.kind, [fmt], SETTINGS)
    assert process.memory_info().rss - before <= 5 * 1024 * 1024


def test_pixel_cap_is_checked_before_pillow_opens_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_open(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("Pillow was reached")

    monkeypatch.setattr(sniff.Image, "open", no_open)
    with pytest.raises(MediaError) as caught:
        check_content(png_header_only(40000, 40000), "image", [PNG], SETTINGS)
    assert "89478485 pixels" in caught.value.public
    with pytest.raises(MediaError):
        check_content(jpeg_with_size(20000, 20000), "image", [JPEG], SETTINGS)


def test_pixel_cap_and_shape_limits_are_settings() -> None:
    big = png(40, 40)
    with pytest.raises(MediaError):
        check_content(big, "image", [PNG], media_settings(max_image_pixels=1599))
    assert check_content(big, "image", [PNG], media_settings(max_image_pixels=1600)) is PNG
    assert check_content(png(1, 1), "image", [PNG], media_settings(min_image_side=1)) is PNG
    assert (
        check_content(png(1, 300), "image", [PNG], media_settings(min_image_side=1, max_image_aspect_ratio=300)) is PNG
    )


def test_undeclared_content_is_judged_by_its_bytes() -> None:
    assert check_content(jpeg(), "image", [], SETTINGS) is JPEG
    with pytest.raises(MediaError):
        check_content(avi(), "image", [], SETTINGS)
    assert check_content(mp3(), "audio", [], SETTINGS).mime == "audio/mpeg"


@pytest.mark.parametrize(
    "name", ["jpeg-truncated", "png-header-plus-zip", "png-40000x40000-header-only", "fits-as-png"]
)
async def test_hostile_files_through_every_source(net: TestNet, media_root: Path, name: str) -> None:
    mime, data = HOSTILE[name]
    root = media_root
    ext = "jpg" if mime == "image/jpeg" else "png"
    (root / f"hostile.{ext}").write_bytes(data)
    net.origin.routes[f"/hostile.{ext}"] = body(data, mime)
    settings = media_settings(root)
    for value in (data_url(mime, data), f"hostile.{ext}", f"http://allowed.test/hostile.{ext}"):
        assert (await refusal(settings, net.network(), value)).code == "invalid_media"


async def test_remote_content_type_and_extension_must_agree_with_the_bytes(net: TestNet) -> None:
    net.origin.routes["/photo.png"] = body(jpeg(), "image/jpeg")  # extension says PNG
    net.origin.routes["/photo"] = body(jpeg(), "image/png")  # Content-Type says PNG
    net.origin.routes["/generic"] = body(jpeg(), "application/octet-stream")  # says nothing
    for path in ("/photo.png", "/photo"):
        assert (await refusal(SETTINGS, net.network(), f"http://allowed.test{path}")).code == "invalid_media"
    [(_, mime)] = await load(SETTINGS, net.network(), "http://allowed.test/generic")
    assert mime == "image/jpeg"


@pytest.mark.parametrize("mime", ["video/mp4", "video/x-msvideo", "video/x-ms-wmv", "audio/flac", "audio/mpeg"])
async def test_every_format_loads_as_a_data_url(net: TestNet, mime: str) -> None:
    fmt = format_for_mime(mime)
    assert fmt is not None
    [(data, got)] = await load(SETTINGS, net.network(), data_url(mime, VALID[mime]), PART_OF[fmt.kind])
    assert (data, got) == (VALID[mime], mime)


async def test_mime_aliases_answer_the_canonical_type(net: TestNet) -> None:
    [(_, mime)] = await load(SETTINGS, net.network(), data_url("image/jpg", jpeg()))
    assert mime == "image/jpeg"
    [(_, mime)] = await load(SETTINGS, net.network(), data_url("audio/wav", wav()), "audio_url")
    assert mime == "audio/x-wav"


async def test_bad_base64_is_refused(net: TestNet) -> None:
    for value in ("data:image/png;base64,iVBOR w0KGgo=", "data:image/png;base64,@@@@", "/9j/4AAQ!"):
        assert (await refusal(SETTINGS, net.network(), value)).code == "invalid_media_reference"
