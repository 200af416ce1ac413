"""End-to-end fixtures: the real tritonserver with the tiny model, and the frontend in a thread.

``triton_server`` starts one tritonserver per session through the launcher's own
``TritonServerProcess`` (same binary preparation, same generated model repository, the same
private Unix sockets) and stops it by PID at the end; ``trained_triton_server`` does the same for the tiny
model trained to call a tool and to think (only when a test asks for it). ``frontend_factory`` starts uvicorn frontends against it
in background threads, each on a free 127.0.0.1 port; ``frontend_url`` is the default one.
Every test in this folder is marked ``e2e``.
"""

from __future__ import annotations

import atexit
import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from openai_frontend.launcher.cache import cache_root
from openai_frontend.launcher.model_repo import MODEL_NAME, backend_python_path, write_model_repository
from openai_frontend.launcher.network import bind_listening_socket
from openai_frontend.launcher.triton_install import locate_tritonserver
from openai_frontend.launcher.tritonserver import TritonServerProcess
from python_backend.protocol.settings import EngineSettings
from tests.e2e.processes import stop
from tests.fixtures.device import engine_test_device

SERVED_MODEL_NAME = "tiny-qwen2-chat"
LORA_NAME = "tiny-lora"
TRAINED_MODEL_NAME = "tiny-trained-chat"
READY_TIMEOUT_S = 180.0
FRONTEND_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TritonHandle:
    """A running tritonserver serving the tiny model as ``model_name``."""

    grpc_url: str  # "unix:PATH:0", for tritonclient.grpc and FrontendSettings.triton_grpc_url
    model_name: str  # the Triton model name ("triton_chat")
    served_model_name: str  # the name clients send as `model`
    settings: EngineSettings
    process: TritonServerProcess

    def http_client(self, timeout: float) -> httpx.Client:
        """An httpx client for tritonserver's own HTTP listener (a Unix socket of this user's)."""
        return triton_http_client(self.process, timeout)

    def first_response(self, tensors: dict[str, np.ndarray], timeout: float) -> tuple[Any, Any]:
        """(result, error) of the first response to one request of ``tensors``, sent as a
        tritonclient user sends it: over a gRPC stream (the model is decoupled)."""
        inputs = []
        for name, array in tensors.items():
            entry = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == np.bool_ else "BYTES")
            entry.set_data_from_numpy(array)
            inputs.append(entry)
        got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = grpcclient.InferenceServerClient(self.grpc_url)
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        try:
            client.async_stream_infer(self.model_name, inputs)
            return got.get(timeout=timeout)
        finally:
            client.stop_stream()
            client.close()


def triton_http_client(process: TritonServerProcess, timeout: float) -> httpx.Client:
    listener = process.endpoints.http
    if listener.socket_path is None:
        return httpx.Client(base_url=listener.http_url(), timeout=timeout)
    transport = httpx.HTTPTransport(uds=listener.socket_path)
    return httpx.Client(base_url="http://localhost", transport=transport, timeout=timeout)


def start_triton(repo_parent: Path, settings: EngineSettings, log_path: Path) -> TritonServerProcess:
    """Start a tritonserver for ``settings`` and wait until the model is ready (stopped on failure)."""
    install = locate_tritonserver(cache_root())
    repo = write_model_repository(repo_parent, settings)
    process = TritonServerProcess(install, log_path)
    env = backend_python_path()
    env["HF_HUB_OFFLINE"] = "1"
    process.start(repo, env)
    # Also on an interrupted session: never leave a server behind (stop() is idempotent).
    atexit.register(process.stop)
    try:
        process.wait_ready(READY_TIMEOUT_S, MODEL_NAME)
    except BaseException:
        process.stop()
        raise
    return process


def e2e_settings(model_dir: Path, served_model_name: str, **values: Any) -> EngineSettings:
    """A test server's engine settings: float32 on the test device, 4 sequences, unless ``values``
    say otherwise."""
    defaults: dict[str, Any] = {"dtype": "float32", "device": engine_test_device(), "max_num_seqs": 4}
    return EngineSettings(model_path=str(model_dir), served_model_name=served_model_name, **{**defaults, **values})


@contextmanager
def serving(settings: EngineSettings, work: Path) -> Iterator[TritonHandle]:
    """A tritonserver serving ``settings`` (its repository and log in ``work``), ready; stopped by
    PID on leaving."""
    process = start_triton(work / "models", settings, work / "tritonserver.log")
    try:
        yield TritonHandle(process.endpoints.grpc_url, MODEL_NAME, settings.served_model_name, settings, process)
    finally:
        process.stop()


@pytest.fixture(scope="session")
def triton_server(
    tiny_model_dir: Path, tiny_lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonHandle]:
    settings = e2e_settings(
        tiny_model_dir,
        SERVED_MODEL_NAME,
        # Long enough that a cancelled stream is visibly cut short: the tiny model writes
        # thousands of tokens a second, so only a very long request is still running when the
        # test looks (test_chat_e2e.test_disconnect_mid_stream_frees_the_engine_slot).
        max_iter_times=30000,
        max_num_seqs=8,
        max_seq_len=32768,
        max_input_token_len=1024,
        # One LoRA adapter: requests name it with `model` (test_chat_e2e); the others use the base.
        lora_modules=json.dumps({LORA_NAME: str(tiny_lora_dir)}),
    )
    with serving(settings, tmp_path_factory.mktemp("triton")) as handle:
        yield handle


@pytest.fixture(scope="session")
def trained_triton_server(trained_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonHandle]:
    """A second tritonserver, serving the tiny model trained to call a tool and to think."""
    settings = e2e_settings(trained_model_dir, TRAINED_MODEL_NAME, max_iter_times=256)
    with serving(settings, tmp_path_factory.mktemp("triton-trained")) as handle:
        yield handle


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Where a test puts the server processes it starts: each is stopped by PID afterwards, the
    last started first (a frontend before the tritonserver it talks to)."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in reversed(started):
            stop(process, timeout=60)


@dataclass
class _Frontend:
    server: Any  # uvicorn.Server
    thread: threading.Thread
    url: str


def _run_frontend(values: dict[str, Any]) -> _Frontend:
    """A uvicorn frontend with these ``FrontendSettings`` values, in a thread, on a free port."""
    import uvicorn

    from openai_frontend.app import create_app
    from openai_frontend.settings import FrontendSettings

    app = create_app(FrontendSettings.model_validate(values))
    sock = bind_listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    # Outside the main thread uvicorn installs no signal handlers, which is what a test wants.
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"frontend-{port}", daemon=True)
    thread.start()
    frontend = _Frontend(server, thread, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + FRONTEND_START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the frontend on port {port} did not start")
        time.sleep(0.05)
    # The socket now belongs to uvicorn's event loop, which closes it at shutdown.
    return frontend


def _stop_frontends(started: list[_Frontend]) -> None:
    for frontend in started:
        frontend.server.should_exit = True
    for frontend in started:
        frontend.thread.join(10)


def _frontend_values(triton: TritonHandle, overrides: dict[str, Any]) -> dict[str, Any]:
    adapters = json.loads(triton.settings.lora_modules) if triton.settings.lora_modules else {}
    return {
        "triton_grpc_url": triton.grpc_url,
        "triton_model_name": triton.model_name,
        "served_model_name": triton.served_model_name,
        "lora_names": list(adapters),
        **overrides,
    }


@pytest.fixture(scope="session")
def frontend_factory(triton_server: TritonHandle) -> Iterator[Callable[..., str]]:
    """``start(**settings_overrides) -> base URL``: a frontend on its own free port, for the session."""
    started: list[_Frontend] = []

    def start(**overrides: Any) -> str:
        started.append(_run_frontend(_frontend_values(triton_server, overrides)))
        return started[-1].url

    try:
        yield start
    finally:
        _stop_frontends(started)


@pytest.fixture(scope="session")
def trained_frontend_url(trained_triton_server: TritonHandle) -> Iterator[str]:
    """Base URL of a default frontend in front of ``trained_triton_server``."""
    started = [_run_frontend(_frontend_values(trained_triton_server, {}))]
    try:
        yield started[0].url
    finally:
        _stop_frontends(started)


@pytest.fixture(scope="session")
def frontend_url(frontend_factory: Callable[..., str]) -> str:
    """Base URL (no ``/v1``) of a frontend with default settings in front of ``triton_server``."""
    return frontend_factory()
