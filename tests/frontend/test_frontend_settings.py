"""``FrontendSettings`` validation and the ``ChatBackend`` seam's conformance."""

from __future__ import annotations

import pytest
from frontend_fakes import FakeBackend
from pydantic import ValidationError

from openai_frontend.client.base import ChatBackend
from openai_frontend.client.triton import TritonBackend
from openai_frontend.settings import FrontendSettings


def test_defaults() -> None:
    settings = FrontendSettings(served_model_name="m")
    assert settings.triton_model_name == "triton_chat"
    assert settings.mindie_mode and not settings.full_text_enabled and not settings.strict_params
    assert settings.api_keys == [] and settings.lora_names == []
    assert settings.request_timeout_s == 600 and settings.token_timeout_s == 600
    assert settings.max_body_bytes == 64 * 1024 * 1024
    assert settings.model_names == ("m",)
    assert not FrontendSettings(served_model_name="m", openai_mode="openai").mindie_mode


@pytest.mark.parametrize(
    "bad",
    [
        {"served_model_name": ""},
        {"served_model_name": "m", "lora_names": ["m"]},
        {"served_model_name": "m", "lora_names": ["a", "a"]},
        {"served_model_name": "m", "api_keys": [""]},
        {"served_model_name": "m", "request_timeout_s": 0},
        {"served_model_name": "m", "token_timeout_s": -1},
        {"served_model_name": "m", "max_body_bytes": -1},
        {"served_model_name": "m", "unknown_setting": 1},
    ],
)
def test_invalid_settings_are_rejected(bad: dict) -> None:
    with pytest.raises(ValidationError):
        FrontendSettings(**bad)


def test_backends_satisfy_the_protocol() -> None:
    assert isinstance(FakeBackend(), ChatBackend)
    assert isinstance(TritonBackend(client=object(), model_name="m", request_timeout_s=1), ChatBackend)
