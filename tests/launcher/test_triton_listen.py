"""``serve``'s tritonserver listener flags: loopback and free ports by default, fixed ports and
addresses on request, exposure only with ``--allow-external``."""

from __future__ import annotations

from pathlib import Path

import pytest

from openai_frontend.launcher.cli import parse_args, parse_serve_args
from openai_frontend.launcher.options import FrontendOptions
from openai_frontend.launcher.triton_endpoints import TritonListen
from openai_frontend.launcher.triton_install import TritonInstall
from openai_frontend.launcher.tritonserver import TritonServerProcess


def _flag_values(cmd: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(cmd, cmd[1:], strict=False) if flag.startswith("--")}


def test_by_default_every_listener_is_loopback_on_a_free_port() -> None:
    listen = parse_serve_args(["serve"]).triton_listen
    assert listen == TritonListen()
    endpoints = listen.endpoints()
    assert len({endpoints.grpc_port, endpoints.http_port, endpoints.metrics_port}) == 3
    assert endpoints.grpc_url == f"127.0.0.1:{endpoints.grpc_port}"


def test_fixed_ports_and_addresses_reach_the_command_line(tmp_path: Path) -> None:
    listen = parse_serve_args(
        ["serve", "--triton-grpc-port", "18001", "--triton-http-port", "18000", "--triton-metrics-port", "18002",
         "--triton-metrics-address", "0.0.0.0", "--allow-external"]
    ).triton_listen  # fmt: skip
    endpoints = listen.endpoints()
    cmd = TritonServerProcess(TritonInstall(Path("tritonserver"), None), tmp_path / "log").command(tmp_path, endpoints)
    flags = _flag_values(cmd)
    assert (flags["--grpc-port"], flags["--http-port"], flags["--metrics-port"]) == ("18001", "18000", "18002")
    assert (flags["--grpc-address"], flags["--http-address"], flags["--metrics-address"]) == (
        "127.0.0.1",
        "127.0.0.1",
        "0.0.0.0",
    )
    # A wildcard listener is reached over loopback from this machine.
    assert endpoints.metrics_url == "http://127.0.0.1:18002/metrics"
    assert endpoints.grpc_url == "127.0.0.1:18001"


def test_a_specific_address_is_reached_at_that_address() -> None:
    endpoints = TritonListen(grpc_address="::1", grpc_port=5, http_address="10.1.2.3", http_port=6).endpoints()
    assert endpoints.grpc_url == "[::1]:5"
    assert endpoints.http_url == "http://10.1.2.3:6"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--triton-grpc-address", "0.0.0.0"], "--triton-grpc-address 0.0.0.0 would let other machines reach"),
        (["--triton-metrics-port", "70000"], "must be a port number 0-65535"),
        (["--triton-grpc-port", "9000", "--triton-http-port", "9000"], "--triton-http-port 9000 is also --triton-grpc"),
    ],
)
def test_bad_listener_flags_are_usage_errors(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_serve_args(["serve", *argv])
    assert caught.value.code == 2
    assert words in capsys.readouterr().err


def test_the_frontend_command_takes_tritons_metrics_address_and_vllm_names() -> None:
    options = parse_args(
        ["frontend", "--triton-url", "127.0.0.1:8001", "--served-model-name", "m",
         "--triton-metrics-url", "http://127.0.0.1:8002/metrics", "--metrics-vllm-names"]
    )  # fmt: skip
    assert isinstance(options, FrontendOptions)
    assert options.triton_metrics_url == "http://127.0.0.1:8002/metrics" and options.metrics_vllm_names
    from openai_frontend.launcher.frontend_only import frontend_settings

    assert frontend_settings(options).metrics_vllm_names
