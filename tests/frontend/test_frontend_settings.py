"""``FrontendSettings`` validation and the ``ChatBackend`` seam's conformance."""

from __future__ import annotations

import pytest
from frontend_fakes import FakeBackend
from pydantic import ValidationError

from openai_frontend.client.base import ChatBackend
from openai_frontend.client.triton import TritonBackend
from openai_frontend.launcher.cli import parse_args
from openai_frontend.launcher.frontend_only import frontend_settings
from openai_frontend.launcher.options import FrontendOptions
from openai_frontend.settings import FrontendSettings, HttpLimits


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


def test_http_limits_have_documented_defaults_and_come_from_the_flags() -> None:
    defaults = FrontendSettings(served_model_name="m").http_limits
    assert defaults == HttpLimits(32 * 1024, 100, 20.0, 120.0, 1024)
    options = parse_args(
        ["frontend", "--triton-url", "h:1", "--served-model-name", "m", "--max-header-bytes", "4096",
         "--max-headers", "10", "--header-timeout", "3", "--body-timeout", "7.5", "--max-connections", "9"]
    )  # fmt: skip
    assert isinstance(options, FrontendOptions)
    assert frontend_settings(options).http_limits == HttpLimits(4096, 10, 3.0, 7.5, 9)


@pytest.mark.parametrize("flag", ["--max-header-bytes", "--max-headers", "--header-timeout", "--body-timeout"])
def test_http_limits_must_be_positive(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["frontend", "--triton-url", "h:1", "--served-model-name", "m", flag, "0"])
    assert exited.value.code == 2
    assert f"{flag} must be > 0" in capsys.readouterr().err
