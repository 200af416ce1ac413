"""Tiny media files made in memory: valid samples of every accepted format, and hostile ones."""

from __future__ import annotations

import io
import random
import struct
import wave
import zipfile
import zlib

from PIL import Image


def png(width: int = 4, height: int = 3, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def noisy_png(side: int, seed: int = 0) -> bytes:
    """An incompressible PNG of about 3 x side^2 bytes (for size-cap tests)."""
    rng = random.Random(seed)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3)).save(out, "PNG", compress_level=0)
    return out.getvalue()


def jpeg(width: int = 16, height: int = 16) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 120, 240)).save(out, "JPEG", quality=80)
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """Signature, IHDR of any size, a tiny IDAT and IEND: a decompression bomb's header (~70 bytes)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00")) + _chunk(b"IEND", b"")


def jpeg_with_size(width: int, height: int) -> bytes:
    """A valid small JPEG whose frame header claims ``width`` x ``height``."""
    data = bytearray(jpeg())
    at = 2
    while data[at + 1] not in (0xC0, 0xC1, 0xC2):
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    data[at + 5 : at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def zip_bytes() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("payload.txt", "not an image")
    return out.getvalue()


def gif_huge_frames() -> bytes:
    """Animated GIF header with a 65535 x 65535 screen and a huge first frame descriptor."""
    screen = b"GIF89a" + struct.pack("<HHBBB", 65535, 65535, 0xF7, 0, 0) + b"\x00" * 768
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 65535, 65535, 0) + b"\x08\x02\x4c\x01\x00\x3b"
    return screen + frame


def fits() -> bytes:
    card = b"SIMPLE  =                    T" + b" " * 50
    return card + b"END" + b" " * 77 + b"\x00" * (2880 - 160)


def wav(seconds: float = 0.05, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x01" * int(seconds * rate))
    return out.getvalue()


def wav_raw(rate: int, byte_rate: int, align: int, data_size: int, actual: int) -> bytes:
    """A PCM WAV whose header fields are chosen freely (``actual`` data bytes follow)."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, byte_rate, align, 8 * align)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", data_size) + b"\x00" * actual
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def flac(total_samples: int = 4410, rate: int = 44100) -> bytes:
    info = bytearray(34)
    info[0:4] = struct.pack(">HH", 4096, 4096)
    packed = (rate << 44) | (0 << 41) | (15 << 36) | total_samples  # mono, 16 bits
    info[10:18] = packed.to_bytes(8, "big")
    return b"fLaC" + bytes([0x80]) + (34).to_bytes(3, "big") + bytes(info) + b"\xff\xf8" + b"\x00" * 32


def mp3(frames: int = 3) -> bytes:
    frame = b"\xff\xfb\x90\x64" + b"\x00" * 413  # MPEG-1 layer III, 128 kbit/s, 44.1 kHz
    return b"ID3\x04\x00\x00\x00\x00\x00\x00" + frame * frames


def mp4() -> bytes:
    ftyp = struct.pack(">I", 24) + b"ftypisom" + struct.pack(">I", 0x200) + b"isommp41"
    return ftyp + struct.pack(">I", 16) + b"mdat" + b"\x00" * 8


def avi() -> bytes:
    hdrl = b"hdrl" + b"avih" + struct.pack("<I", 56) + b"\x00" * 56
    riff = b"AVI " + b"LIST" + struct.pack("<I", len(hdrl)) + hdrl
    return b"RIFF" + struct.pack("<I", len(riff)) + riff


def wmv() -> bytes:
    guid = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")
    return guid + struct.pack("<QIBB", 30, 0, 1, 2) + b"\x00" * 16


VALID = {
    "image/png": png(),
    "image/jpeg": jpeg(),
    "audio/x-wav": wav(),
    "audio/flac": flac(),
    "audio/mpeg": mp3(),
    "video/mp4": mp4(),
    "video/x-msvideo": avi(),
    "video/x-ms-wmv": wmv(),
}
