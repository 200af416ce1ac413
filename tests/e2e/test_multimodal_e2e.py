"""Multimodal chat through tritonserver and the frontend, with the openai client.

Two more servers, started only when these tests run: a tiny random Qwen2-VL model (images as a
``data:`` URL and as a local ``file://`` under the frontend's media root, a video file) and a
tiny random Qwen2-Audio model (``input_audio``, format 5). The text-only tiny model answers media
with a 400. Media are generated at test time (tests/fixtures/tiny_multimodal.py).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import openai
import pytest
from openai.types.chat import ChatCompletionUserMessageParam

from tests.e2e.conftest import TritonHandle, _frontend_values, _run_frontend, _stop_frontends, e2e_settings, serving
from tests.fixtures.tiny_multimodal import (
    build_tiny_audio_model,
    build_tiny_vl_model,
    image_bytes,
    mp4_bytes,
    wav_bytes,
)

VL_MODEL_NAME = "tiny-qwen2-vl"
AUDIO_MODEL_NAME = "tiny-qwen2-audio"


def _serve(folder: Path, name: str, work: Path) -> Iterator[TritonHandle]:
    with serving(e2e_settings(folder, name, device="cpu", max_iter_times=64), work) as handle:
        yield handle


@pytest.fixture(scope="module")
def vl_triton_server(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> Iterator[TritonHandle]:
    folder = build_tiny_vl_model(tmp_path_factory.mktemp("tiny-qwen2-vl"), tiny_tokenizer)
    yield from _serve(folder, VL_MODEL_NAME, tmp_path_factory.mktemp("triton-vl"))


@pytest.fixture(scope="module")
def audio_triton_server(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> Iterator[TritonHandle]:
    folder = build_tiny_audio_model(tmp_path_factory.mktemp("tiny-qwen2-audio"), tiny_tokenizer)
    yield from _serve(folder, AUDIO_MODEL_NAME, tmp_path_factory.mktemp("triton-audio"))


@pytest.fixture(scope="module")
def media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("multimodal_inputs")


def _frontend(triton: TritonHandle, media_root: Path) -> Iterator[openai.OpenAI]:
    started = [_run_frontend(_frontend_values(triton, {"media": {"media_root": f"{media_root}/"}}))]
    try:
        yield openai.OpenAI(base_url=f"{started[0].url}/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        _stop_frontends(started)


@pytest.fixture(scope="module")
def vl_client(vl_triton_server: TritonHandle, media_root: Path) -> Iterator[openai.OpenAI]:
    yield from _frontend(vl_triton_server, media_root)


@pytest.fixture(scope="module")
def audio_client(audio_triton_server: TritonHandle, media_root: Path) -> Iterator[openai.OpenAI]:
    yield from _frontend(audio_triton_server, media_root)


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def ask(client: openai.OpenAI, model: str, parts: list[dict[str, Any]], **extra: Any) -> Any:
    content = [*parts, {"type": "text", "text": "What is this?"}]
    # The frontend takes more media formats (video_url, a bare image string) than the openai
    # client's types name; the client sends the message as it is.
    message = cast(ChatCompletionUserMessageParam, {"role": "user", "content": content})
    return client.chat.completions.create(model=model, messages=[message], temperature=0, max_tokens=8, **extra)


def test_image_as_data_url_and_as_local_file(vl_client: openai.OpenAI, media_root: Path) -> None:
    png = image_bytes(11)
    (media_root / "picture.png").write_bytes(png)
    inline = ask(vl_client, VL_MODEL_NAME, [{"type": "image_url", "image_url": {"url": data_url(png, "image/png")}}])
    local = ask(
        vl_client, VL_MODEL_NAME, [{"type": "image_url", "image_url": {"url": f"file://{media_root}/picture.png"}}]
    )
    plain = ask(vl_client, VL_MODEL_NAME, [])
    assert inline.choices[0].message.content == local.choices[0].message.content
    assert inline.usage.completion_tokens == 8
    # 96x64 -> 6 image tokens plus vision start and end.
    assert inline.usage.prompt_tokens == plain.usage.prompt_tokens + 8
    assert inline.choices[0].message.content != plain.choices[0].message.content


def test_image_streaming(vl_client: openai.OpenAI) -> None:
    part = {"type": "image_url", "image_url": {"url": data_url(image_bytes(12, fmt="JPEG"), "image/jpeg")}}
    chunks = list(ask(vl_client, VL_MODEL_NAME, [part], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert text == ask(vl_client, VL_MODEL_NAME, [part]).choices[0].message.content


def test_video_file(vl_client: openai.OpenAI, media_root: Path) -> None:
    (media_root / "clip.mp4").write_bytes(mp4_bytes(seed=3))
    reply = ask(
        vl_client, VL_MODEL_NAME, [{"type": "video_url", "video_url": {"url": f"file://{media_root}/clip.mp4"}}]
    )
    assert reply.usage.completion_tokens == 8


def test_undecodable_image_is_a_400_naming_the_part(vl_client: openai.OpenAI) -> None:
    # A real PNG header (the frontend's content check passes) with a broken body.
    broken = image_bytes(13)[:60]
    with pytest.raises(openai.BadRequestError) as err:
        ask(vl_client, VL_MODEL_NAME, [{"type": "image_url", "image_url": {"url": data_url(broken, "image/png")}}])
    assert "messages.0.content.0" in str(err.value)


def test_input_audio(audio_client: openai.OpenAI) -> None:
    def clip(freq: float) -> dict[str, Any]:
        encoded = base64.b64encode(wav_bytes(1.0, freq)).decode()
        return {"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}}

    low, high = (ask(audio_client, AUDIO_MODEL_NAME, [clip(f)]) for f in (220.0, 880.0))
    plain = ask(audio_client, AUDIO_MODEL_NAME, [])
    assert low.usage.prompt_tokens == high.usage.prompt_tokens > plain.usage.prompt_tokens + 25
    assert len({low.choices[0].message.content, high.choices[0].message.content, plain.choices[0].message.content}) == 3


def test_audio_on_the_vision_model_is_a_400(vl_client: openai.OpenAI) -> None:
    encoded = base64.b64encode(wav_bytes(0.5)).decode()
    with pytest.raises(openai.BadRequestError) as err:
        ask(vl_client, VL_MODEL_NAME, [{"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}}])
    assert "does not accept audio" in str(err.value)


def test_the_text_only_model_answers_an_image_with_a_400(triton_server: TritonHandle, frontend_url: str) -> None:
    client = openai.OpenAI(base_url=f"{frontend_url}/v1", api_key="unused", max_retries=0, timeout=120)
    part = {"type": "image_url", "image_url": {"url": data_url(image_bytes(14), "image/png")}}
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, triton_server.served_model_name, [part])
    assert "this model accepts text only" in str(err.value)


def test_bare_string_and_url_object_formats(vl_client: openai.OpenAI, media_root: Path) -> None:
    """Formats 1 and 2 (a bare string; {"url": ...}) with a local path and a base64 JPG."""
    jpg = image_bytes(13, fmt="JPEG")
    (media_root / "photo.jpg").write_bytes(jpg)
    answers = [
        ask(vl_client, VL_MODEL_NAME, [{"type": "image_url", "image_url": part}]).choices[0].message.content
        for part in (
            f"{media_root}/photo.jpg",  # format 1, a local path
            base64.b64encode(jpg).decode(),  # format 1, base64 JPG
            {"url": f"{media_root}/photo.jpg"},  # format 2
            {"url": data_url(jpg, "image/jpeg")},  # format 4
        )
    ]
    assert len(set(answers)) == 1
    assert answers[0] != ask(vl_client, VL_MODEL_NAME, []).choices[0].message.content
