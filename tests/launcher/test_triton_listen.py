"""``serve``'s tritonserver listener flags: private Unix sockets by default, TCP ports and
addresses on request, exposure only with ``--allow-external``, no TCP inference beside a key."""

from __future__ import annotations

from pathlib import Path

import pytest

from openai_frontend.launcher.cli import parse_args, parse_serve_args
from openai_frontend.launcher.options import FrontendOptions
from openai_frontend.launcher.triton_endpoints import TritonListen, private_socket_dir
from openai_frontend.launcher.triton_install import TritonInstall
from openai_frontend.launcher.tritonserver import TritonServerProcess


def _flag_values(cmd: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(cmd, cmd[1:], strict=False) if flag.startswith("--")}


def test_by_default_every_listener_is_a_private_socket(tmp_path: Path) -> None:
    listen = parse_serve_args(["serve"]).triton_listen
    assert listen == TritonListen() and listen.exposed == ()
    endpoints = listen.endpoints(tmp_path)
    assert [endpoints.http.socket_path, endpoints.metrics.socket_path] == [
        str(tmp_path / "http"),
        str(tmp_path / "metrics"),
    ]
    assert endpoints.grpc_url == f"unix:{tmp_path}/grpc:0"
    assert sorted(endpoints.sockets()) == sorted([tmp_path / "grpc:0", tmp_path / "http", tmp_path / "metrics"])


def test_a_port_alone_puts_that_listener_on_loopback_tcp(tmp_path: Path) -> None:
    listen = parse_serve_args(["serve", "--triton-metrics-port", "0"]).triton_listen
    assert listen.exposed == ("metrics",)
    endpoints = listen.endpoints(tmp_path)
    assert endpoints.metrics.address == "127.0.0.1" and endpoints.metrics.port > 0
    assert endpoints.grpc.socket_path == str(tmp_path / "grpc")


def test_the_private_socket_directory_is_this_users_alone() -> None:
    folder = private_socket_dir()
    try:
        assert folder.stat().st_mode & 0o777 == 0o700
        assert len(str(folder / "metrics")) < 100  # within sun_path
    finally:
        folder.rmdir()


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
    listen = TritonListen(grpc_address="::1", grpc_port=5, http_address="10.1.2.3", http_port=6, metrics_address="::1")
    endpoints = listen.endpoints()
    assert endpoints.grpc_url == "[::1]:5"
    assert endpoints.http_url == "http://10.1.2.3:6"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--triton-grpc-address", "0.0.0.0"], "--triton-grpc-address 0.0.0.0 would let other machines reach"),
        (["--triton-metrics-port", "70000"], "must be a port number 0-65535"),
        (["--triton-grpc-port", "9000", "--triton-http-port", "9000"], "--triton-http-port 9000 is also --triton-grpc"),
        (
            ["--triton-http-port", "8000", "--api-key", "k"],
            "--triton-http-port puts tritonserver's HTTP listener on TCP",
        ),
        (["--triton-grpc-address", "127.0.0.1", "--api-key", "k"], "it cannot go with --api-key"),
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
