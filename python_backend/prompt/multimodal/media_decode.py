"""Decoding media bytes (the ``media`` tensor) into images, audio samples and video frames.

Owns: ``MediaLimits`` (server-side ceilings; clients have no knobs), ``decode_media`` and the
decoded types. Images go through Pillow restricted to JPEG and PNG; audio and video through PyAV
(FFmpeg), audio resampled to mono at the processor's rate, video frames sampled at a fixed rate.
Every failure is a 400 that names the message part (``messages.0.content.1``) and never carries
the decoder's own text: library messages can leak paths or internals and change across versions.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from PIL import Image

from python_backend.protocol.errors import ContractError, invalid

logger = logging.getLogger(__name__)

_IMAGE_MIMES = {"image/jpeg": "JPEG", "image/png": "PNG"}
# MIME type -> the PyAV (FFmpeg demuxer) names that may carry it.
_AUDIO_MIMES = {"audio/mpeg": ("mp3",), "audio/x-wav": ("wav",), "audio/flac": ("flac",)}
_VIDEO_MIMES = {"video/mp4": ("mov", "mp4"), "video/x-msvideo": ("avi",), "video/x-ms-wmv": ("asf",)}


@dataclass(frozen=True)
class MediaLimits:
    """Ceilings applied while decoding, before any model work."""

    max_items: int = 20  # media parts per request (the frontend's default; tritonclient callers skip it)
    max_image_pixels: int = 4096 * 4096
    max_audio_seconds: float = 30.0  # Whisper-style encoders read 30 s windows
    video_fps: float = 2.0
    max_video_frames: int = 16
    max_video_seconds: float = 600.0
    max_frame_pixels: int = 1920 * 1080


@dataclass(frozen=True)
class AudioClip:
    samples: np.ndarray  # float32, mono
    sampling_rate: int


@dataclass(frozen=True)
class VideoClip:
    frames: list[Image.Image]  # RGB, sampled at ``fps``
    fps: float


DecodedMedia = Image.Image | AudioClip | VideoClip


def _bad(where: str, what: str) -> ContractError:
    return invalid(f"'{where}' could not be decoded as {what}", where)


def decode_image(data: bytes, mime: str, where: str, limits: MediaLimits) -> Image.Image:
    fmt = _IMAGE_MIMES.get(mime)
    if fmt is None:
        raise invalid(f"'{where}' has media type '{mime}'; images must be image/jpeg or image/png", where)
    with _decoding(where, f"a {fmt} image"):
        image = Image.open(io.BytesIO(data), formats=[fmt])
        width, height = image.size
        # Checked from the header, before the pixels are decoded (decompression bombs).
        if width * height > limits.max_image_pixels:
            raise invalid(f"'{where}' is {width}x{height} pixels; the limit is {limits.max_image_pixels} pixels", where)
        image.load()
        return image.convert("RGB")


@contextmanager
def _decoding(where: str, what: str) -> Iterator[None]:
    """Any failure inside, but our own errors, is the 400 saying ``where`` is not ``what``."""
    try:
        yield
    except ContractError:
        raise
    except Exception as exc:  # the decoders raise many types (OSError, SyntaxError, ValueError, av.error.*)
        logger.info("%s decode failed for %s: %r", what, where, exc)
        raise _bad(where, what) from exc


def _open_container(data: bytes, allowed: tuple[str, ...], where: str, what: str) -> Any:
    """An input container whose demuxer is one of ``allowed`` (the declared type's)."""
    import av

    try:
        container = av.open(io.BytesIO(data), mode="r")
    except Exception as exc:  # av.error.* and ValueError for unknown data
        logger.info("container open failed for %s: %r", where, exc)
        raise _bad(where, what) from exc
    names = set(container.format.name.split(","))
    if not names & set(allowed):
        container.close()
        raise _bad(where, what)
    return container


def decode_audio(data: bytes, mime: str, where: str, limits: MediaLimits, sampling_rate: int) -> AudioClip:
    allowed = _AUDIO_MIMES.get(mime)
    if allowed is None:
        raise invalid(f"'{where}' has media type '{mime}'; audio must be MP3, WAV or FLAC", where)
    import av

    what = f"{allowed[0].upper()} audio"
    container = _open_container(data, allowed, where, what)
    with _decoding(where, what), closing(container):
        if not container.streams.audio:
            raise _bad(where, what)
        # Planar float at the target rate, channels kept: we average them ourselves, because
        # FFmpeg's stereo-to-mono downmix adds the channels at -3 dB and can exceed full scale.
        resampler = av.AudioResampler(format="fltp", rate=sampling_rate)
        chunks: list[np.ndarray] = []
        total = 0
        cap = int(limits.max_audio_seconds * sampling_rate)
        for frame in container.decode(audio=0):
            for out in resampler.resample(frame):
                chunk = out.to_ndarray().mean(axis=0)
                chunks.append(chunk)
                total += chunk.size
            if total > cap:
                raise invalid(f"'{where}' is longer than {limits.max_audio_seconds:g} seconds", where)
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().mean(axis=0))
    samples = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise invalid(f"'{where}' contains no audio samples", where)
    return AudioClip(samples[:cap], sampling_rate)


def decode_video(data: bytes, mime: str, where: str, limits: MediaLimits) -> VideoClip:
    allowed = _VIDEO_MIMES.get(mime)
    if allowed is None:
        raise invalid(f"'{where}' has media type '{mime}'; video must be MP4, AVI or WMV", where)
    what = f"{mime.split('/')[1]} video"
    container = _open_container(data, allowed, where, what)
    frames: list[Image.Image] = []
    with _decoding(where, what), closing(container):
        if not container.streams.video:
            raise _bad(where, what)
        stream = container.streams.video[0]
        # A source slower than the sampling rate gives every frame: its own rate is the clip's.
        fps = min(limits.video_fps, float(stream.average_rate or limits.video_fps))
        if stream.width * stream.height > limits.max_frame_pixels:
            raise invalid(
                f"'{where}' frames are {stream.width}x{stream.height}; the limit is {limits.max_frame_pixels} pixels",
                where,
            )
        step = Fraction(1) / Fraction(limits.video_fps).limit_denominator(1000)
        next_at = Fraction(0)
        for frame in container.decode(video=0):
            at = Fraction(frame.time) if frame.time is not None else next_at
            if at > limits.max_video_seconds:
                break  # later content is ignored, as with the frame ceiling
            if at + Fraction(1, 1000) >= next_at:
                frames.append(frame.to_image().convert("RGB"))
                next_at += step
                if len(frames) >= limits.max_video_frames:
                    break
    if not frames:
        raise invalid(f"'{where}' contains no video frames", where)
    return VideoClip(frames, fps)


def decode_media(
    kind: str, data: bytes, mime: str, where: str, limits: MediaLimits, sampling_rate: int = 16000
) -> DecodedMedia:
    """Decode one item referenced by a part of type ``kind`` (image/video/audio)."""
    if kind == "image":
        return decode_image(data, mime, where, limits)
    if kind == "audio":
        return decode_audio(data, mime, where, limits, sampling_rate)
    if kind == "video":
        return decode_video(data, mime, where, limits)
    raise invalid(f"'{where}' has unknown media kind '{kind}'", where)
