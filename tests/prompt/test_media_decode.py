"""Media decoding: accepted formats, server ceilings, resampling, frame sampling, and 400s that
name the message part without the decoder's own text."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from python_backend.prompt.multimodal.media_decode import AudioClip, MediaLimits, VideoClip, decode_media
from python_backend.protocol.errors import ContractError
from tests.fixtures.tiny_multimodal import encoded_audio, image_bytes, mp4_bytes, wav_bytes

WHERE = "messages.0.content.1"
LIMITS = MediaLimits()


def _error(kind: str, data: bytes, mime: str, limits: MediaLimits = LIMITS) -> ContractError:
    with pytest.raises(ContractError) as err:
        decode_media(kind, data, mime, WHERE, limits)
    info = err.value.info
    assert info.status == 400 and info.param == WHERE and WHERE in info.message
    return err.value


@pytest.mark.parametrize(("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg")])
def test_png_and_jpeg_decode_to_rgb(fmt: str, mime: str) -> None:
    image = decode_media("image", image_bytes(size=(40, 30), fmt=fmt), mime, WHERE, LIMITS)
    assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (40, 30)


def test_other_image_formats_are_refused_even_when_pillow_reads_them() -> None:
    gif = io.BytesIO()
    Image.new("RGB", (8, 8)).save(gif, format="GIF")
    _error("image", gif.getvalue(), "image/png")  # declared PNG, is GIF: the PNG decoder refuses
    _error("image", gif.getvalue(), "image/gif")
    _error("image", image_bytes(fmt="PNG"), "image/jpeg")  # a PNG is not a JPEG


def test_garbage_and_truncated_images_name_the_part_without_library_text() -> None:
    error = _error("image", b"\x89PNG\r\n\x1a\nnot really", "image/png")
    assert "cannot identify" not in error.info.message and "PIL" not in error.info.message
    _error("image", image_bytes(fmt="JPEG")[:200], "image/jpeg")


def test_the_pixel_cap_is_checked_before_decoding() -> None:
    error = _error("image", image_bytes(size=(100, 100)), "image/png", MediaLimits(max_image_pixels=5000))
    assert "100x100" in error.info.message


def test_wav_is_resampled_to_mono_at_the_processor_rate() -> None:
    clip = decode_media("audio", wav_bytes(0.5, rate=44100, channels=2), "audio/x-wav", WHERE, LIMITS, 16000)
    assert isinstance(clip, AudioClip) and clip.sampling_rate == 16000
    assert clip.samples.dtype == np.float32 and clip.samples.ndim == 1
    assert abs(clip.samples.size - 8000) < 400
    assert 0.2 < float(np.abs(clip.samples).max()) < 0.5  # 12000 / 32768


@pytest.mark.parametrize(("fmt", "mime"), [("mp3", "audio/mpeg"), ("flac", "audio/flac")])
def test_mp3_and_flac_decode(fmt: str, mime: str) -> None:
    clip = decode_media("audio", encoded_audio(fmt, 0.5, rate=22050), mime, WHERE, LIMITS, 16000)
    assert isinstance(clip, AudioClip) and abs(clip.samples.size - 8000) < 1200
    assert 0.2 < float(np.abs(clip.samples).max()) < 0.4


def test_audio_longer_than_the_ceiling_is_refused() -> None:
    error = _error("audio", wav_bytes(2.0), "audio/x-wav", MediaLimits(max_audio_seconds=1.0))
    assert "longer than 1 seconds" in error.info.message


def test_audio_in_the_wrong_container_or_garbage_is_refused() -> None:
    _error("audio", wav_bytes(), "audio/flac")  # a WAV declared as FLAC
    _error("audio", b"RIFF\x00\x00\x00\x00WAVEjunk", "audio/x-wav")
    _error("audio", wav_bytes(), "audio/ogg")


def test_video_frames_are_sampled_at_the_server_rate_with_a_ceiling() -> None:
    clip = decode_media("video", mp4_bytes(frames=8, fps=4), "video/mp4", WHERE, LIMITS)
    assert isinstance(clip, VideoClip) and len(clip.frames) == 4  # 2 s at 2 fps
    assert clip.frames[0].size == (64, 48)
    capped = decode_media("video", mp4_bytes(frames=8, fps=4), "video/mp4", WHERE, MediaLimits(max_video_frames=3))
    assert isinstance(capped, VideoClip) and len(capped.frames) == 3


@pytest.mark.parametrize(("container", "mime"), [("avi", "video/x-msvideo"), ("asf", "video/x-ms-wmv")])
def test_avi_and_wmv_decode(container: str, mime: str) -> None:
    clip = decode_media("video", mp4_bytes(frames=4, fps=2, container_format=container), mime, WHERE, LIMITS)
    assert isinstance(clip, VideoClip) and len(clip.frames) == 4


def test_video_errors() -> None:
    _error("video", mp4_bytes(), "video/x-msvideo")  # an MP4 declared as AVI
    _error("video", b"\x00\x00\x00\x18ftypmp42garbage", "video/mp4")
    _error("video", wav_bytes(), "video/mp4")  # audio-only data
    _error("video", mp4_bytes(size=(64, 48)), "video/mp4", MediaLimits(max_frame_pixels=1000))
