"""``triton-chat serve``: start tritonserver with the model, wait for it, run the frontend, stop both.

Owns the start/stop sequence and signal handling. Order on the way up: bind the frontend port
(fail fast), check the model folder and the device, find tritonserver, resolve the model
(converting the demo once), write a temporary model repository, start the server in its own process group and wait until the model
is ready, then run uvicorn in this process while ``supervisor.Supervisor`` watches tritonserver
(and restarts it when the model's process dies). Each stage of the way up is a line with the
seconds since start (``start_stages``), the conversion's and the model's included; a start that
fails says why, where tritonserver's log is, and its last lines. On the way down (Ctrl-C, SIGTERM, or
tritonserver dying): stop uvicorn, stop tritonserver by its PID (SIGTERM, then SIGKILL after 30 s), and
remove the temporary repository. Every step registers its undo before it can fail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from openai_frontend.launcher.cache import cache_root
from openai_frontend.launcher.demo_model import DEMO_DTYPE, DEMO_SERVED_NAME, DemoModelError, ensure_demo_model
from openai_frontend.launcher.dtype_check import check_dtype, checkpoint_torch_dtype
from openai_frontend.launcher.log_rotation import MIB, LogRotation
from openai_frontend.launcher.model_check import ModelFolderError, check_device, check_model_folder, model_folder
from openai_frontend.launcher.model_repo import (
    MODEL_NAME,
    ModelRepositoryError,
    backend_python_path,
    instance_count,
    write_model_repository,
)
from openai_frontend.launcher.network import bind_listening_socket, is_loopback
from openai_frontend.launcher.options import ServeOptions, engine_settings, http_settings, media_settings
from openai_frontend.launcher.start_stages import EventFile, StageReport, following
from openai_frontend.launcher.supervisor import Supervisor
from openai_frontend.launcher.triton_access import RestrictedAccess, version_problem
from openai_frontend.launcher.triton_install import TritonInstallError, locate_tritonserver
from openai_frontend.launcher.tritonserver import TritonServerError, TritonServerProcess, TritonStartError
from python_backend.protocol.settings import SettingsError
from python_backend.protocol.start_events import START_EVENTS_ENV

logger = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_OK = 0
EXIT_FAILED = 1
EVENTS_NAME = "start-events.jsonl"  # in the run folder: the start stages of the conversion and the model


# Startup failures the user can act on: reported as one message, without a traceback.
class LaunchError(RuntimeError):
    """A startup failure of the launcher's own (e.g. the frontend port is taken)."""


LAUNCH_ERRORS = (
    LaunchError,
    DemoModelError,
    TritonInstallError,
    TritonServerError,
    ModelRepositoryError,
    ModelFolderError,
    SettingsError,
)


class ShutdownRequested(BaseException):
    """A signal arrived while starting. A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way up can mistake it for an ordinary failure."""


@dataclass
class _Shutdown:
    """What the signal handlers and the tritonserver watcher share with the main thread."""

    signals: list[int] = field(default_factory=list)
    server: Any = None  # the uvicorn.Server once it exists
    triton_died: bool = False
    raise_on_signal: bool = True

    def triton_lost(self) -> None:
        """tritonserver is gone for good (the supervisor's verdict): stop the frontend, exit 1."""
        self.triton_died = True
        if self.server is not None:
            self.server.should_exit = True

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)
        if self.server is not None:
            self.server.should_exit = True
        if self.raise_on_signal:
            raise ShutdownRequested(signum)


def run_serve(options: ServeOptions) -> int:
    """Run until a signal or a tritonserver failure; the exit status for the console script."""
    report = StageReport.for_logger(logger)
    state = _Shutdown()
    previous = {sig: signal.signal(sig, state.handle) for sig in HANDLED_SIGNALS}
    try:
        with contextlib.ExitStack() as undo:
            try:
                return _serve(options, state, undo, report)
            except ShutdownRequested:
                logger.info("interrupted while starting; stopping")
                return EXIT_OK
            except TritonStartError as exc:
                report.start_failed(exc.what, exc.log_path, exc.tail)
                return EXIT_FAILED
            except LAUNCH_ERRORS as exc:
                logger.error("%s", exc)
                return EXIT_FAILED
            finally:
                # Clean-up must not be cut short by a second Ctrl-C: from here signals only count.
                state.raise_on_signal = False
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(options: ServeOptions, state: _Shutdown, undo: contextlib.ExitStack, report: StageReport) -> int:
    try:
        listener = bind_listening_socket(options.host, options.port)
    except OSError as exc:
        raise LaunchError(f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}") from exc
    undo.callback(listener.close)
    if not is_loopback(options.host) and not options.api_keys:
        logger.warning("listening on %s without --api-key: anyone who can reach it can use the model", options.host)

    cache = cache_root()
    # Everything that can be checked from files goes first: the demo conversion takes 20-45 s and
    # tritonserver's own report of a bad folder comes after the stub has imported torch.
    given = (
        check_model_folder(model_folder(options.model, options.model_origin, options.engine_flags))
        if options.model
        else None
    )
    check_device(options.device, options.device_origin)
    checkpoint = checkpoint_torch_dtype(given) if given is not None else DEMO_DTYPE
    dtype = check_dtype(options.dtype, options.device, checkpoint, options.dtype_origin)
    install = locate_tritonserver(cache)
    run_dir = Path(tempfile.mkdtemp(prefix="triton-chat-"))
    undo.callback(shutil.rmtree, run_dir, ignore_errors=True)
    events = EventFile(run_dir / EVENTS_NAME, logger)
    if given is not None:
        model_dir = given
        served_name = options.served_model_name or model_dir.name
    else:
        with following(report, events, "converting the demo model"):
            model_dir = ensure_demo_model(cache, report.line, events=events.path)
        served_name = options.served_model_name or DEMO_SERVED_NAME
    settings = engine_settings(options, model_dir, served_name)

    repo = write_model_repository(run_dir / "models", settings, instances=options.instances)
    instances = instance_count(repo)
    if instances > 1 and options.response_channel:
        # A channel is open in one instance, and Triton may send a stream naming it to another.
        logger.info("%d model instances: each stream gets its own responses (no response channel)", instances)
        options = replace(options, response_channel=False)

    log_path = (options.triton_log or cache / "logs" / f"tritonserver-{options.port}.log").expanduser()
    # tritonserver's listeners are Unix sockets only this user can open, unless the user gave
    # them ports; an exposed one keeps other machines off Triton's admin APIs (docs/security.md).
    listen = options.triton_listen
    access = RestrictedAccess() if listen.exposed else None
    triton = TritonServerProcess(install, log_path, access=access)
    undo.callback(_stop_triton, triton)
    env = backend_python_path()
    env["HF_HUB_OFFLINE"] = "1"  # models are local folders; never download at run time
    env[START_EVENTS_ENV] = str(events.path)  # the model's process tells its stages there
    endpoints = triton.start(repo, env, listen)
    report.line(
        f"started tritonserver (pid {triton.pid}), loading '{served_name}' from {model_dir} in {dtype.dtype} "
        f"({dtype.reason}); log: {log_path}"
    )
    logger.info(
        "tritonserver listens on gRPC %s, HTTP %s, metrics %s",
        endpoints.grpc_url,
        endpoints.http_url,
        endpoints.metrics_url,
    )
    for name in listen.exposed:
        logger.warning(
            "tritonserver's %s listener is on a TCP port: every local user can reach it, without the "
            "frontend's key or limits",
            name,
        )
    with following(report, events, "starting tritonserver and the model"):
        triton.wait_ready(options.ready_timeout_s, MODEL_NAME)
    report.line(f"tritonserver ready (pid {triton.pid})")
    problem = version_problem(triton.version())
    if problem is not None:
        logger.warning("%s", problem)

    shown_host = f"[{options.host}]" if ":" in options.host else options.host
    address = f"{'https' if options.tls else 'http'}://{shown_host}:{options.port}/v1"

    def frontend_ready() -> None:
        report.line(f"frontend ready: serving '{served_name}' at {address} (Triton gRPC at {endpoints.grpc_url})")

    server = _make_uvicorn(options, triton, served_name, settings.max_logprobs, frontend_ready)
    supervisor = Supervisor(
        triton,
        repo,
        env,
        MODEL_NAME,
        options.ready_timeout_s,
        on_fatal=state.triton_lost,
        max_restarts=options.max_restarts,
        drain=server.config.app.state.frontend.drain,
        log_rotation=LogRotation(log_path, options.triton_log_max_mb * MIB),
    )
    watcher = threading.Thread(target=supervisor.run, name="triton-watch", daemon=True)
    # uvicorn installs its own SIGINT/SIGTERM handlers while it runs and afterwards restores
    # ours and re-raises what it caught: ours must then only record it.
    state.raise_on_signal = False
    state.server = server
    if state.signals:
        return EXIT_OK
    watcher.start()
    undo.callback(_join, watcher, supervisor.stop)
    server.run(sockets=[listener])
    return EXIT_FAILED if state.triton_died else EXIT_OK


def _make_uvicorn(
    options: ServeOptions,
    triton: TritonServerProcess,
    served_name: str,
    max_logprobs: int,
    on_started: Callable[[], None],
) -> Any:
    # Imported late: uvicorn and the app are not needed until the model is ready.
    from openai_frontend.app import create_app
    from openai_frontend.launcher.draining_server import draining_server
    from openai_frontend.settings import FrontendSettings

    # model_validate: the frontend's pydantic checks apply, and its defaults fill the rest.
    settings = FrontendSettings.model_validate(
        {
            "triton_grpc_url": triton.endpoints.grpc_url,
            "triton_model_name": MODEL_NAME,
            "served_model_name": served_name,
            "lora_names": list(options.lora_modules),
            "max_logprobs": max_logprobs,  # the model's ceiling, so both refuse the same requests
            **http_settings(options),
            "media": media_settings(options, os.environ),
        }
    )
    app = create_app(settings, engine_metrics=triton.read_metrics)
    return draining_server(
        app, options.host, options.port, options.tls, options.drain_timeout_s, options.log_level, on_started
    )


def _join(thread: threading.Thread, stop: threading.Event) -> None:
    stop.set()
    thread.join(5.0)


def _stop_triton(triton: TritonServerProcess) -> None:
    if triton.pid is None:
        return
    logger.info("stopping tritonserver (pid %d)", triton.pid)
    code = triton.stop()
    logger.info("tritonserver stopped (status %s)", code)
