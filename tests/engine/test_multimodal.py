"""Multimodal requests through the real engine on tiny random Qwen2-VL and Qwen2-Audio models.

Requests are built the way the Triton adapter builds them (``decode_request`` over the contract
tensors), so these tests cover media decoding, placeholder expansion, the media prefill (alone,
with M-RoPE positions) and decoding in the same batch as text requests.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import GenerationMixin

from python_backend.engine.engine import Engine
from python_backend.engine.sequence import EngineRequest
from python_backend.model.loader import LoadedModel, load_model
from python_backend.prompt.inputs import decode_request
from python_backend.prompt.multimodal.positions import mm_token_types
from python_backend.protocol import contract
from python_backend.protocol.errors import ContractError
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.engine_driver import Collected
from tests.fixtures.tiny_multimodal import (
    build_tiny_audio_model,
    build_tiny_vl25_model,
    build_tiny_vl_model,
    image_bytes,
    mp4_bytes,
    wav_bytes,
)

_ids = itertools.count()
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


def generator(loaded: LoadedModel) -> GenerationMixin:
    """The transformers model behind ``loaded``, whose ``generate`` is the reference answer."""
    model = loaded.transformers_model
    assert isinstance(model, GenerationMixin), type(model)
    return model


@pytest.fixture(scope="module")
def vl_loaded(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> LoadedModel:
    folder = build_tiny_vl_model(tmp_path_factory.mktemp("tiny-qwen2-vl"), tiny_tokenizer)
    return load_model(EngineSettings(model_path=str(folder), dtype="float32", device="cpu"))


@pytest.fixture(scope="module")
def audio_loaded(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> LoadedModel:
    folder = build_tiny_audio_model(tmp_path_factory.mktemp("tiny-qwen2-audio"), tiny_tokenizer)
    return load_model(EngineSettings(model_path=str(folder), dtype="float32", device="cpu"))


@pytest.fixture
def vl_engine(vl_loaded: LoadedModel, start_engine: Callable[..., Engine]) -> Engine:
    return start_engine(vl_loaded)


@pytest.fixture
def audio_engine(audio_loaded: LoadedModel, start_engine: Callable[..., Engine]) -> Engine:
    return start_engine(audio_loaded)


def tensors(content: Any, media: list[tuple[bytes, str]] = (), **params: Any) -> dict[str, np.ndarray]:  # type: ignore[assignment]
    """The contract tensors the frontend sends for one user message."""
    found: dict[str, np.ndarray] = {
        contract.MESSAGES: contract.json_tensor([{"role": "user", "content": content}]),
        contract.PARAMETERS: contract.json_tensor({**GREEDY, **params}),
    }
    if media:
        found[contract.MEDIA] = np.array([data for data, _ in media], dtype=np.object_)
        found[contract.MEDIA_TYPES] = np.array([mime.encode() for _, mime in media], dtype=np.object_)
    return found


def submit(engine: Engine, loaded: LoadedModel, inputs: dict[str, np.ndarray]) -> Collected:
    prepared = decode_request(inputs.get, loaded.tokenizer, loaded.adapters, None, loaded.media)
    out = Collected()
    engine.submit(
        EngineRequest(
            request_id=f"mm-{next(_ids)}",
            prompt_ids=prepared.prompt_ids,
            params=prepared.params,
            sink=out.sink,
            stream=True,
            media=prepared.media,
        )
    )
    return out


def image_part(index: int = 0) -> dict[str, Any]:
    return {"type": "image", "media_index": index}


def test_an_image_changes_the_output_and_counts_its_tokens(vl_engine: Engine, vl_loaded: LoadedModel) -> None:
    text = [{"type": "text", "text": "What is in the picture?"}]
    plain = submit(vl_engine, vl_loaded, tensors(text)).wait()
    red = submit(vl_engine, vl_loaded, tensors([image_part(), *text], [(image_bytes(1), "image/png")])).wait()
    blue = submit(vl_engine, vl_loaded, tensors([image_part(), *text], [(image_bytes(2), "image/png")])).wait()
    for out in (plain, red, blue):
        assert out.error is None, out.error
        assert out.usage().completion_tokens == 12
    # 96x64 -> grid (1, 4, 6) -> 6 image tokens, plus vision start and end.
    assert red.usage().prompt_tokens == plain.usage().prompt_tokens + 8
    assert len({plain.text(), red.text(), blue.text()}) == 3


@pytest.fixture(scope="module")
def vl25_loaded(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> LoadedModel:
    folder = build_tiny_vl25_model(tmp_path_factory.mktemp("tiny-qwen2.5-vl"), tiny_tokenizer)
    return load_model(EngineSettings(model_path=str(folder), dtype="float32", device="cpu"))


@pytest.mark.parametrize("kind", ["image", "video"])
@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
def test_a_media_request_matches_transformers_generate(
    request: pytest.FixtureRequest, arch: str, kind: str, start_engine: Callable[..., Engine]
) -> None:
    """Greedy output equals ``generate``'s: the M-RoPE prefill positions and decode deltas are right."""
    import torch

    vl_loaded: LoadedModel = request.getfixturevalue("vl_loaded" if arch == "qwen2_vl" else "vl25_loaded")
    assert vl_loaded.model_type == arch

    media = (image_bytes(7), "image/png") if kind == "image" else (mp4_bytes(frames=4, fps=1, seed=7), "video/mp4")
    inputs = tensors([{"type": kind, "media_index": 0}, {"type": "text", "text": "Describe it."}], [media])
    prepared = decode_request(inputs.get, vl_loaded.tokenizer, frozenset(), None, vl_loaded.media)
    assert prepared.media is not None
    input_ids = torch.tensor([prepared.prompt_ids])
    extra = dict(prepared.media.tensors)
    accepted = inspect.signature(vl_loaded.transformers_model.forward).parameters
    if "mm_token_type_ids" in accepted:
        extra["mm_token_type_ids"] = mm_token_types(vl_loaded.transformers_model, input_ids)  # transformers 5
    if kind == "video" and "second_per_grid_ts" in accepted:
        extra["second_per_grid_ts"] = torch.tensor(prepared.media.video_seconds_per_grid)
    with torch.inference_mode():
        generated = generator(vl_loaded).generate(
            input_ids=input_ids,
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
            **extra,
        )
    expected = vl_loaded.tokenizer.decode(generated[0, len(prepared.prompt_ids) :], skip_special_tokens=True)
    engine = start_engine(vl_loaded)
    assert submit(engine, vl_loaded, inputs).wait().text() == expected


def test_text_on_a_vl_model_matches_transformers_generate(vl_engine: Engine, vl_loaded: LoadedModel) -> None:
    """Text rows on an M-RoPE model: 1-D positions, expanded by the model to three equal rows."""
    import torch

    inputs = tensors([{"type": "text", "text": "Just words, no pictures."}])
    prepared = decode_request(inputs.get, vl_loaded.tokenizer, frozenset(), None, vl_loaded.media)
    assert prepared.media is None
    with torch.inference_mode():
        generated = generator(vl_loaded).generate(
            input_ids=torch.tensor([prepared.prompt_ids]), max_new_tokens=12, do_sample=False, eos_token_id=None
        )
    expected = vl_loaded.tokenizer.decode(generated[0, len(prepared.prompt_ids) :], skip_special_tokens=True)
    assert submit(vl_engine, vl_loaded, inputs).wait().text() == expected


def test_an_image_request_is_repeatable(vl_engine: Engine, vl_loaded: LoadedModel) -> None:
    inputs = tensors(
        [image_part(), {"type": "text", "text": "Describe."}], [(image_bytes(3, fmt="JPEG"), "image/jpeg")]
    )
    assert submit(vl_engine, vl_loaded, inputs).wait().text() == submit(vl_engine, vl_loaded, inputs).wait().text()


def test_a_video_changes_the_output(vl_engine: Engine, vl_loaded: LoadedModel) -> None:
    text = {"type": "text", "text": "What happens?"}
    one = submit(
        vl_engine, vl_loaded, tensors([{"type": "video", "media_index": 0}, text], [(mp4_bytes(seed=1), "video/mp4")])
    ).wait()
    two = submit(
        vl_engine, vl_loaded, tensors([{"type": "video", "media_index": 0}, text], [(mp4_bytes(seed=2), "video/mp4")])
    ).wait()
    plain = submit(vl_engine, vl_loaded, tensors([text])).wait()
    assert one.error is None and two.error is None, (one.error, two.error)
    assert len({one.text(), two.text(), plain.text()}) == 3
    assert one.usage().prompt_tokens > plain.usage().prompt_tokens


def test_media_request_batches_with_text_requests_without_changing_them(
    vl_engine: Engine, vl_loaded: LoadedModel
) -> None:
    image = tensors([image_part(), {"type": "text", "text": "Look."}], [(image_bytes(4), "image/png")], max_tokens=24)
    texts = [tensors([{"type": "text", "text": f"Count to {n}."}], max_tokens=24) for n in range(3)]
    alone = [submit(vl_engine, vl_loaded, t).wait().text() for t in [image, *texts]]
    outs = [submit(vl_engine, vl_loaded, t) for t in [texts[0], image, texts[1], texts[2]]]
    together = [o.wait() for o in outs]
    assert max(max(d.usage.batch_size) for o in together for d in o.deltas if d.usage is not None) > 1
    assert [o.text() for o in together] == [alone[1], alone[0], alone[2], alone[3]]


def test_two_images_in_one_message(vl_engine: Engine, vl_loaded: LoadedModel) -> None:
    content = [image_part(0), {"type": "text", "text": "and"}, image_part(1)]
    out = submit(vl_engine, vl_loaded, tensors(content, [(image_bytes(5), "image/png"), (image_bytes(6), "image/png")]))
    assert out.wait().error is None


def test_an_audio_clip_changes_the_output(audio_engine: Engine, audio_loaded: LoadedModel) -> None:
    text = {"type": "text", "text": "What do you hear?"}
    low = submit(
        audio_engine,
        audio_loaded,
        tensors([{"type": "audio", "media_index": 0}, text], [(wav_bytes(1.0, 220), "audio/x-wav")]),
    ).wait()
    high = submit(
        audio_engine,
        audio_loaded,
        tensors([{"type": "audio", "media_index": 0}, text], [(wav_bytes(1.0, 880), "audio/x-wav")]),
    ).wait()
    plain = submit(audio_engine, audio_loaded, tensors([text])).wait()
    assert low.error is None and high.error is None, (low.error, high.error)
    assert len({low.text(), high.text(), plain.text()}) == 3
    # 1 s at 16 kHz -> 100 mel frames -> 25 audio tokens (two stride-2 stages).
    assert low.usage().prompt_tokens - plain.usage().prompt_tokens == 25 + len(
        audio_loaded.tokenizer.encode("Audio: <|audio_bos|><|audio_eos|>", add_special_tokens=False)
    )


def test_an_audio_request_matches_transformers_generate(audio_engine: Engine, audio_loaded: LoadedModel) -> None:
    import torch

    inputs = tensors(
        [{"type": "audio", "media_index": 0}, {"type": "text", "text": "Hm?"}], [(wav_bytes(0.7, 330), "audio/x-wav")]
    )
    prepared = decode_request(inputs.get, audio_loaded.tokenizer, frozenset(), None, audio_loaded.media)
    assert prepared.media is not None
    with torch.inference_mode():
        generated = generator(audio_loaded).generate(
            input_ids=torch.tensor([prepared.prompt_ids]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
            **prepared.media.tensors,
        )
    expected = audio_loaded.tokenizer.decode(generated[0, len(prepared.prompt_ids) :], skip_special_tokens=True)
    assert submit(audio_engine, audio_loaded, inputs).wait().text() == expected


def test_media_the_model_does_not_take_is_a_400(vl_loaded: LoadedModel, audio_loaded: LoadedModel) -> None:
    with pytest.raises(ContractError) as err:
        decode_request(
            tensors([{"type": "audio", "media_index": 0}], [(wav_bytes(), "audio/x-wav")]).get,
            vl_loaded.tokenizer,
            frozenset(),
            None,
            vl_loaded.media,
        )
    assert err.value.info.status == 400 and err.value.info.param == "messages.0.content.0.type"
    with pytest.raises(ContractError) as err:
        decode_request(
            tensors([image_part()], [(image_bytes(), "image/png")]).get,
            audio_loaded.tokenizer,
            frozenset(),
            None,
            audio_loaded.media,
        )
    assert "does not accept image" in err.value.info.message


def test_bad_media_bytes_are_a_400_naming_the_part(vl_loaded: LoadedModel) -> None:
    content = [{"type": "text", "text": "hi"}, image_part()]
    with pytest.raises(ContractError) as err:
        decode_request(
            tensors(content, [(b"not a png", "image/png")]).get, vl_loaded.tokenizer, frozenset(), None, vl_loaded.media
        )
    assert err.value.info.status == 400
    assert err.value.info.param == "messages.0.content.1"
    assert "messages.0.content.1" in err.value.info.message


def test_an_image_request_with_beam_search(vl_engine: Engine, vl_loaded: LoadedModel) -> None:
    inputs = tensors([image_part()], [(image_bytes(9), "image/png")], use_beam_search=True, n=2, temperature=1.0)
    out = submit(vl_engine, vl_loaded, inputs).wait()
    assert out.error is None
    assert sorted(d.index for d in out.deltas) == [0, 1]


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_media_inputs_follow_the_model_dtype(
    tmp_path: Path, tiny_tokenizer: Any, kind: str, start_engine: Callable[..., Engine]
) -> None:
    """bfloat16 weights: pixel values and mel features are cast to the model's dtype at prefill."""
    build = build_tiny_vl_model if kind == "image" else build_tiny_audio_model
    folder = build(tmp_path / kind, tiny_tokenizer)
    loaded = load_model(EngineSettings(model_path=str(folder), dtype="bfloat16", device="cpu"))
    media = (image_bytes(10), "image/png") if kind == "image" else (wav_bytes(0.5), "audio/x-wav")
    engine = start_engine(loaded)
    out = submit(engine, loaded, tensors([{"type": kind, "media_index": 0}], [media])).wait()
    assert out.error is None and out.usage().completion_tokens == 12


def test_a_template_kept_with_the_processor_is_used(tmp_path: Path, tiny_tokenizer: Any) -> None:
    """Some VL checkpoints keep the chat template in chat_template.json (the processor's) only."""
    import json

    folder = build_tiny_vl_model(tmp_path / "vl", tiny_tokenizer)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    template = config.pop("chat_template")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    loaded = load_model(EngineSettings(model_path=str(folder), dtype="float32", device="cpu"))
    assert loaded.tokenizer.chat_template == template


def test_too_many_media_parts_are_a_400(vl_loaded: LoadedModel) -> None:
    content = [image_part(0)] * 21
    with pytest.raises(ContractError) as err:
        decode_request(
            tensors(content, [(image_bytes(), "image/png")]).get,
            vl_loaded.tokenizer,
            frozenset(),
            None,
            vl_loaded.media,
        )
    assert "limit is 20" in err.value.info.message


def test_an_image_request_with_two_choices(vl_engine: Engine, vl_loaded: LoadedModel) -> None:
    """n=2: both rows of the request start from the media prefill and carry its rope delta."""
    inputs = tensors([image_part()], [(image_bytes(8), "image/png")], n=2, temperature=1.0, seed=5)
    both = submit(vl_engine, vl_loaded, inputs).wait()
    assert both.error is None
    assert sorted(d.index for d in both.deltas if d.finish_reason is not None) == [0, 1]
    assert all(d.usage.completion_tokens == 12 for d in both.deltas if d.usage is not None)


def test_media_index_out_of_range_is_a_400(vl_loaded: LoadedModel) -> None:
    with pytest.raises(ContractError) as err:
        decode_request(
            tensors([image_part(3)], [(image_bytes(), "image/png")]).get,
            vl_loaded.tokenizer,
            frozenset(),
            None,
            vl_loaded.media,
        )
    assert err.value.info.param == "messages.0.content.0.media_index"


def test_a_text_only_model_answers_media_with_a_400(tiny_loaded: LoadedModel) -> None:
    assert tiny_loaded.media is None
    inputs = tensors([{"type": "text", "text": "hi"}, image_part()], [(image_bytes(), "image/png")])
    with pytest.raises(ContractError) as err:
        decode_request(inputs.get, tiny_loaded.tokenizer, frozenset(), None, tiny_loaded.media)
    assert err.value.info.status == 400 and err.value.info.param == "messages.0.content.1.type"
    assert "this model accepts text only" in err.value.info.message


def test_a_placeholder_typed_in_text_is_a_400(vl_loaded: LoadedModel) -> None:
    """Image token ids never reach the model without their features."""
    inputs = tensors([{"type": "text", "text": "sneaky <|image_pad|> token"}])
    with pytest.raises(ContractError) as err:
        decode_request(inputs.get, vl_loaded.tokenizer, frozenset(), None, vl_loaded.media)
    assert err.value.info.status == 400 and "placeholder" in err.value.info.message
