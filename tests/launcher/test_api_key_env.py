"""The frontend's key from ``TRITON_CHAT_API_KEY``, where other local users cannot read it."""

from __future__ import annotations

import pytest

from openai_frontend.launcher.cli import parse_args, parse_serve_args
from openai_frontend.launcher.options import FrontendOptions


def test_serve_takes_the_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CHAT_API_KEY", "from-env")
    assert parse_serve_args(["serve"]).api_keys == ("from-env",)
    # A key on the command line wins, as vLLM's --api-key over VLLM_API_KEY.
    assert parse_serve_args(["serve", "--api-key", "flag"]).api_keys == ("flag",)


def test_the_frontend_command_takes_it_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CHAT_API_KEY", "from-env")
    options = parse_args(["frontend", "--triton-url", "127.0.0.1:8001", "--served-model-name", "m"])
    assert isinstance(options, FrontendOptions) and options.api_keys == ("from-env",)


def test_an_empty_variable_is_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CHAT_API_KEY", "")
    assert parse_serve_args(["serve"]).api_keys == ()


def test_a_key_in_the_environment_forbids_tritons_inference_ports_as_a_flag_would(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRITON_CHAT_API_KEY", "from-env")
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "--triton-http-port", "8000"])
    assert "it cannot go with --api-key" in capsys.readouterr().err
