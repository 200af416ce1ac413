"""Content checks: is this really the media it claims to be, and is it safe to hand on?

Owns: ``sniff`` (format from magic bytes) and ``check_content`` (the whole verdict for one item).
Order, cheapest first, nothing decoded before the size is known:

1. magic bytes name one of the accepted formats (``formats``), of the part's kind, and equal to
   every declared type (``data:`` MIME, file or URL extension, ``input_audio.format``, a media
   ``Content-Type``): a PNG named ``.jpg`` or a GIF named ``.png`` is refused;
2. images: width and height read from the PNG ``IHDR`` / JPEG ``SOF`` header by this module, so
   the pixel cap (and the minimum side and aspect-ratio limits) hold before Pillow sees a byte
   (decompression bombs, 40000x40000 headers);
   then Pillow, limited to that one format (``formats=[...]``: no FITS/GIF/... plugin can run),
   checks structure without a full decode: PNG ``verify`` (chunk CRCs up to ``IEND``, and nothing
   may follow ``IEND``: no PNG+ZIP polyglots), JPEG decoded at 1/8 scale (``draft``) so a
   truncated or corrupt stream fails while memory stays at 1/64 of the pixels;
3. audio: WAV and FLAC headers are read for a plausible sample rate and a declared duration
   within ``max_audio_seconds``, and sizes that do not exceed the data; MP3 needs a valid first
   frame header (after any ID3v2 tag);
4. video: container headers (MP4 ``ftyp`` box, AVI ``RIFF``/``hdrl``, ASF header size) must be
   consistent with the data. Decoding video is the model side's job.

Pillow's own decompression-bomb limit stays at its default (this module never changes Pillow's
global settings).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from PIL import Image

from openai_frontend.media.errors import MediaError, MediaFailure
from openai_frontend.media.formats import AVI, FLAC, JPEG, MP3, MP4, PNG, WAV, WMV, MediaFormat, MediaKind
from openai_frontend.media.policy import MediaSettings

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: every PNG ends with these 12 bytes
ASF_GUID = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")
# Start-of-frame markers carry the image size (not DHT C4, JPG C8, DAC CC).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_NOUN = {"image": "an image", "video": "a video", "audio": "audio"}
_MP3_SCAN = 4096  # bytes after an ID3v2 tag searched for the first frame header


def _invalid(detail: str, public: str | None = None) -> MediaError:
    return MediaError(MediaFailure.INVALID_CONTENT, detail, public)


def _u32le(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "little")


def _mp3_frame_at(data: bytes, at: int) -> bool:
    head = data[at : at + 4]
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return False
    version, layer = (head[1] >> 3) & 3, (head[1] >> 1) & 3
    bitrate, rate = head[2] >> 4, (head[2] >> 2) & 3
    return version != 1 and layer != 0 and bitrate != 15 and rate != 3


def sniff(data: bytes) -> MediaFormat | None:
    """The format the magic bytes name, or None."""
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if data.startswith(PNG_MAGIC):
        return PNG
    if data[4:8] == b"ftyp":
        return MP4
    if data.startswith(b"RIFF") and data[8:12] == b"AVI ":
        return AVI
    if data.startswith(b"RIFF") and data[8:12] == b"WAVE":
        return WAV
    if data.startswith(ASF_GUID):
        return WMV
    if data.startswith(b"fLaC"):
        return FLAC
    if data.startswith(b"ID3") or _mp3_frame_at(data, 0):
        return MP3
    return None


def _png_size(data: bytes) -> tuple[int, int]:
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise _invalid("PNG without IHDR")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _jpeg_size(data: bytes) -> tuple[int, int]:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            raise _invalid("JPEG marker expected")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
        elif marker in (0xD9, 0xDA):
            break  # end of image or start of scan before any frame header
        else:
            length = int.from_bytes(data[at + 2 : at + 4], "big")
            if marker in _SOF_MARKERS and length >= 7 and at + 9 <= len(data):
                return int.from_bytes(data[at + 7 : at + 9], "big"), int.from_bytes(data[at + 5 : at + 7], "big")
            if length < 2:
                raise _invalid("JPEG segment length below 2")
            at += 2 + length
    raise _invalid("JPEG without a frame header")


def _check_image(data: bytes, fmt: MediaFormat, settings: MediaSettings) -> None:
    width, height = _png_size(data) if fmt is PNG else _jpeg_size(data)
    shape = f"image is {width}x{height}"
    if width * height > settings.max_image_pixels:
        raise _invalid(shape, f"is an image of more than {settings.max_image_pixels} pixels")
    if min(width, height) < settings.min_image_side:
        raise _invalid(shape, f"is an image smaller than {settings.min_image_side} pixels on a side")
    if max(width, height) > settings.max_image_aspect_ratio * min(width, height):
        raise _invalid(shape, f"is an image with an aspect ratio over {settings.max_image_aspect_ratio:g}")
    try:
        with Image.open(io.BytesIO(data), formats=[fmt.name.upper()]) as image:
            if image.size != (width, height):
                raise _invalid(f"Pillow reads {image.size}, header says {(width, height)}")
            if fmt is PNG:
                image.verify()
            else:
                image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
                image.load()
    except MediaError:
        raise
    except Exception as exc:  # any parser failure on hostile input means "not a valid image"
        raise _invalid(f"Pillow: {type(exc).__name__}: {exc}") from exc
    if fmt is PNG and not data.endswith(PNG_END):
        raise _invalid("bytes after the PNG IEND chunk, or no IEND")


def _check_wav(data: bytes, max_seconds: float) -> None:
    if _u32le(data, 4) + 8 > len(data):
        raise _invalid("RIFF size exceeds the data")
    at, byte_rate = 12, 0
    while at + 8 <= len(data):
        chunk, size = data[at : at + 4], _u32le(data, at + 4)
        body = data[at + 8 : at + 8 + size]
        if len(body) < size:
            raise _invalid(f"WAV chunk {chunk!r} exceeds the data")
        if chunk == b"fmt ":
            if size < 16:
                raise _invalid("short WAV fmt chunk")
            code, channels = int.from_bytes(body[0:2], "little"), int.from_bytes(body[2:4], "little")
            rate, byte_rate, align = _u32le(body, 4), _u32le(body, 8), int.from_bytes(body[12:14], "little")
            plain = code in (1, 3, 6, 7, 0xFFFE)  # PCM, float, A-law, mu-law, extensible
            if not (1 <= channels <= 64 and 1000 <= rate <= 768_000 and align > 0 and byte_rate > 0):
                raise _invalid(f"WAV fmt: {channels} ch, {rate} Hz, align {align}, {byte_rate} B/s")
            if plain and byte_rate != rate * align:
                raise _invalid(f"WAV byte rate {byte_rate} != {rate} x {align}")
        elif chunk == b"data":
            if not byte_rate:
                raise _invalid("WAV data before fmt")
            if size / byte_rate > max_seconds:
                raise _invalid(f"WAV lasts {size / byte_rate:.0f} s", f"is audio longer than {max_seconds:g} seconds")
            return
        at += 8 + size + (size & 1)
    raise _invalid("WAV without data chunk")


def _check_flac(data: bytes, max_seconds: float) -> None:
    if len(data) < 42 or data[4] & 0x7F != 0 or int.from_bytes(data[5:8], "big") != 34:
        raise _invalid("FLAC without STREAMINFO first")
    info = data[8:42]
    rate = (info[10] << 12) | (info[11] << 4) | (info[12] >> 4)
    total = ((info[13] & 0x0F) << 32) | int.from_bytes(info[14:18], "big")
    if rate == 0:
        raise _invalid("FLAC sample rate 0")
    if total / rate > max_seconds:
        raise _invalid(f"FLAC lasts {total / rate:.0f} s", f"is audio longer than {max_seconds:g} seconds")


def _check_mp3(data: bytes) -> None:
    at = 0
    if data.startswith(b"ID3"):
        if len(data) < 10:
            raise _invalid("short ID3 tag")
        size = 0
        for byte in data[6:10]:
            if byte & 0x80:
                raise _invalid("ID3 size is not syncsafe")
            size = (size << 7) | byte
        at = 10 + size + (10 if data[5] & 0x10 else 0)
    if not any(_mp3_frame_at(data, i) for i in range(at, min(len(data), at + _MP3_SCAN))):
        raise _invalid("no MPEG audio frame header")


def _check_video(data: bytes, fmt: MediaFormat) -> None:
    if fmt is MP4:
        size = int.from_bytes(data[0:4], "big")
        if size == 1:
            size = int.from_bytes(data[8:16], "big")
        if (0 < size < 16 and size != 1) or size > len(data) or not data[8:12].isascii():
            raise _invalid(f"MP4 ftyp box of {size} bytes")
    elif fmt is AVI:
        if data[12:16] != b"LIST" or data[20:24] != b"hdrl":
            raise _invalid("AVI without hdrl list")
    elif fmt is WMV:
        size = int.from_bytes(data[16:24], "little")
        if not 30 <= size <= len(data):
            raise _invalid(f"ASF header of {size} bytes")


def check_content(
    data: bytes, kind: MediaKind, declared: Sequence[MediaFormat], settings: MediaSettings
) -> MediaFormat:
    """The verified format of ``data`` for a part of ``kind``; ``MediaError`` when it is not usable."""
    fmt = sniff(data)
    if fmt is None:
        raise _invalid(f"unknown magic bytes {data[:8].hex()}")
    if fmt.kind != kind:
        raise _invalid(f"{fmt.name} in a {kind} part", f"is not {_NOUN[kind]}")
    if any(d is not fmt for d in declared):
        raise _invalid(
            f"content is {fmt.name}, declared {[d.name for d in declared]}", "does not match its declared media type"
        )
    if kind == "image":
        _check_image(data, fmt, settings)
    elif fmt is WAV:
        _check_wav(data, settings.max_audio_seconds)
    elif fmt is FLAC:
        _check_flac(data, settings.max_audio_seconds)
    elif fmt is MP3:
        _check_mp3(data)
    else:
        _check_video(data, fmt)
    return fmt
