"""Model loading rules: chat template required, device and dtype selection, token bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from python_backend.model.device import DeviceError, resolve_device, resolve_dtype
from python_backend.model.loader import ModelLoadError, load_model
from python_backend.protocol.settings import EngineSettings, SettingsError
from python_backend.text.token_text import TokenTexts
from tests.fixtures.tiny_models import remove_chat_template


def test_a_tokenizer_without_chat_template_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, folder)
    remove_chat_template(folder)
    with pytest.raises(ModelLoadError, match="chat_template"):
        load_model(EngineSettings(model_path=str(folder), dtype="float32"))
    with pytest.raises(ModelLoadError, match="not a local model folder"):
        load_model(EngineSettings(model_path=str(tmp_path / "missing")))


def test_device_and_dtype_selection() -> None:
    if not torch.cuda.is_available():
        assert resolve_device("auto").type in ("cpu", "npu")
        with pytest.raises(DeviceError, match="cuda"):
            resolve_device("cuda:0")
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", "bfloat16", cpu, cpu_bfloat16=True) == torch.bfloat16
    assert resolve_dtype("auto", None, cpu) == torch.float32
    assert resolve_dtype("auto", torch.float16, cpu, cpu_bfloat16=True) == torch.bfloat16  # CPU fp16 is slow
    assert resolve_dtype("float16", "bfloat16", torch.device("cpu")) == torch.float16
    for bad in ({"dtype": "float64"}, {"device": "tpu"}, {"device": "cuda:x"}, {"max_num_seqs": 0}):
        with pytest.raises(SettingsError):
            EngineSettings(**bad)  # type: ignore[arg-type]


def test_token_bytes_are_the_tokens_own_bytes(tiny_tokenizer) -> None:
    texts = TokenTexts(tiny_tokenizer)
    text = "你好 😀 wörld"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(bytes(texts(i)[1]) for i in ids) == text.encode("utf-8")


class _ByteFallbackTokenizer:
    """The two calls TokenTexts makes, as a SentencePiece tokenizer with byte fallback answers them."""

    pieces = {0: "<0xE4>", 1: "▁hello", 2: "<0xBD>"}

    def __len__(self) -> int:
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] for i in ids] if isinstance(ids, list) else self.pieces[ids]

    def decode(self, ids, **kwargs) -> str:
        return "\ufffd" if self.pieces[ids[0]].startswith("<0x") else " hello"


def test_byte_fallback_tokens_report_their_byte() -> None:
    texts = TokenTexts(_ByteFallbackTokenizer())  # type: ignore[arg-type]
    assert texts(0) == ("\ufffd", [0xE4])
    assert texts(2)[1] == [0xBD]
    assert texts(1) == (" hello", list(b" hello"))


def test_trust_remote_code_is_off_unless_asked(tmp_path: Path) -> None:
    from openai_frontend.launcher.cli import parse_serve_args
    from openai_frontend.launcher.options import engine_settings

    assert EngineSettings().trust_remote_code is False
    assert EngineSettings.from_parameters({"trust_remote_code": "true"}).trust_remote_code is True
    assert EngineSettings.from_parameters({"trust_remote_code": "0"}).trust_remote_code is False
    assert EngineSettings(trust_remote_code=True).to_parameters()["trust_remote_code"] == "true"
    with pytest.raises(SettingsError, match="true or false"):
        EngineSettings.from_parameters({"trust_remote_code": "maybe"})
    options = parse_serve_args(["serve", "--model", str(tmp_path), "--trust-remote-code"])
    assert engine_settings(options, tmp_path, "m").trust_remote_code is True
    assert engine_settings(parse_serve_args(["serve"]), tmp_path, "m").trust_remote_code is False


def test_sampling_defaults_follow_generation_config() -> None:
    from python_backend.model.loader import _sampling_defaults

    greedy = _sampling_defaults({"do_sample": False, "temperature": 0.7}, {}, 1000)
    assert greedy.temperature == 0.0
    sampled = _sampling_defaults({"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}, {}, 1000)
    assert (sampled.temperature, sampled.top_p, sampled.top_k) == (0.7, 0.8, 20)
    plain = _sampling_defaults({}, {"top_k": 5000}, 1000)
    assert (plain.temperature, plain.top_k) == (1.0, 1000)  # reference default; top_k clamped to the vocabulary
    assert _sampling_defaults({}, {}, 50000).top_k == 1000  # the ATB rule when no config names one
