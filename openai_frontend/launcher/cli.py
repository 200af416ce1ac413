"""The ``triton-chat`` console script: argument parsing and ``main``.

Owns ``build_parser``, ``parse_args`` / ``parse_serve_args`` (flags, ``--config`` file defaults,
checks) and ``main``; the resulting options are the dataclasses of ``options.py``. Binding the
frontend to anything but loopback needs ``--allow-external``, so exposing the server is always a
deliberate choice.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from openai_frontend.launcher.demo_model import DemoModelError
from openai_frontend.launcher.dtype_check import check_dtype_name
from openai_frontend.launcher.engine_flags import add_engine_flags, engine_values, positive_int
from openai_frontend.launcher.http_flags import (
    add_http_flags,
    api_keys_with_environment,
    check_http_flags,
    http_limits,
    non_negative_int,
    operations_options,
    with_default,
)
from openai_frontend.launcher.log_format import configure_launcher_logging
from openai_frontend.launcher.log_rotation import BACKUPS, DEFAULT_MAX_MB
from openai_frontend.launcher.model_check import ModelFolderError
from openai_frontend.launcher.model_repo import ModelRepositoryError
from openai_frontend.launcher.options import (
    FrontendOptions,
    RepositoryOptions,
    ServeOptions,
    TlsFiles,
    TritonServerArgs,
)
from openai_frontend.launcher.server_config import ConfigFileError, flag_defaults, load_server_file
from openai_frontend.launcher.supervisor import MAX_RESTARTS
from openai_frontend.launcher.triton_flags import add_triton_listen_flags, triton_listen
from openai_frontend.launcher.triton_install import TritonInstallError
from openai_frontend.launcher.worker import WorkerOptions, run_worker
from python_backend.protocol.settings import EngineSettings, SettingsError

logger = logging.getLogger("openai_frontend.launcher")

DEFAULT_READY_TIMEOUT_S = 600.0
HEADLESS_HELP = (
    "run this node's tensor-parallel ranks only, as `triton-chat worker` (a node other than 0 of --nnodes; "
    "no tritonserver, no HTTP frontend)"
)
INSTANCES_HELP = (
    "model instances (instance_group count), each its own engine, Triton spreading requests over them "
    "(default: config.pbtxt's, 1); helps with one instance per GPU/NPU, not on one CPU"
)

# What the own-Triton commands report as one line, without a traceback.
OWN_TRITON_ERRORS = (
    DemoModelError,
    FileExistsError,
    ModelFolderError,
    ModelRepositoryError,
    SettingsError,
    TritonInstallError,
)


def build_parser(serve_defaults: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``serve_defaults`` (from ``--config``) replace built-in defaults."""
    parser = argparse.ArgumentParser(
        prog="triton-chat",
        description="Serve a chat LLM on Triton Inference Server with an OpenAI/MindIE-compatible API.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="start tritonserver with the chat model, then the HTTP frontend",
        description="Start tritonserver (loopback only) with the chat model, then the OpenAI-compatible frontend.",
    )
    add_engine_flags(serve)
    add_http_flags(serve.add_argument_group("HTTP frontend"))
    serve.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="MindIE-style config.json (ServerConfig, ModelConfig, LoraModules); flags override it (default: none)",
    )
    serve.add_argument("--headless", action="store_true", help=with_default(HEADLESS_HELP, "off"))
    if serve_defaults:
        serve.set_defaults(**serve_defaults)

    triton = serve.add_argument_group("tritonserver")
    triton.add_argument(
        "--ready-timeout",
        type=float,
        default=DEFAULT_READY_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long to wait for the model to load (default: {DEFAULT_READY_TIMEOUT_S:g})",
    )
    triton.add_argument(
        "--max-restarts",
        type=non_negative_int,
        default=MAX_RESTARTS,
        metavar="N",
        help="restart tritonserver at most N times in 10 minutes when the model's process dies, the "
        f"server exits or the model stops answering its health probe; then stop (default: {MAX_RESTARTS})",
    )
    triton.add_argument(
        "--triton-log",
        type=Path,
        metavar="FILE",
        help="tritonserver's log file (default: <cache>/logs/tritonserver-<port>.log)",
    )
    triton.add_argument(
        "--triton-log-max-mb",
        type=non_negative_int,
        default=DEFAULT_MAX_MB,
        metavar="MB",
        help=f"past this size, keep tritonserver's log as <log>.1 ({BACKUPS} copies kept) and start it "
        f"afresh; 0: never (default: {DEFAULT_MAX_MB})",
    )

    add_triton_listen_flags(triton)
    triton.add_argument("--instances", type=positive_int, metavar="N", help=INSTANCES_HELP)

    commands.add_parser(
        "tritonserver",
        help="run tritonserver, prepared as serve prepares it, with your own flags (e.g. --model-repository DIR)",
        description="Run tritonserver with the arguments that follow, as given, after preparing what the Python "
        "backend needs: the binary (on PATH, else the nvidia-pytriton wheel's), --backend-directory with this "
        "Python's stub, PATH and LD_LIBRARY_PATH for the stub, python_backend importable. "
        "`triton-chat tritonserver --help` shows tritonserver's own flags.",
        add_help=False,
    )
    repository = commands.add_parser(
        "repository",
        help="write a model repository for a model folder, for tritonserver",
        description="Write DIR/triton_chat (config.pbtxt with model_path and the engine settings from the flags, "
        "and the model code shim); without --model, the demo model (converted once). Then: "
        "triton-chat tritonserver --model-repository DIR",
    )
    repository.add_argument("dest", type=Path, metavar="DIR", help="the model repository folder to write into")
    add_engine_flags(repository)
    repository.add_argument("--instances", type=positive_int, metavar="N", help=INSTANCES_HELP)

    worker = commands.add_parser(
        "worker",
        help="a node other than node 0 of a model spread over --nnodes: its tensor-parallel ranks only",
        description="Run this node's share of the tensor-parallel ranks (--tensor-parallel-size / --nnodes of them) "
        "for node 0's `triton-chat serve`: no tritonserver, no HTTP frontend. Its ranks join rank 0 at "
        "--master-addr:--master-port, and join again each time node 0's model starts. Give it node 0's flags "
        "with its own --node-rank; --nnodes, --node-rank, --master-addr and --master-port also come from "
        "torchrun's environment variables (NNODES/PET_NNODES, NODE_RANK/GROUP_RANK/PET_NODE_RANK, "
        "MASTER_ADDR, MASTER_PORT).",
    )
    add_engine_flags(worker)

    frontend = commands.add_parser(
        "frontend",
        help="only the HTTP frontend, in front of a tritonserver that already serves the model",
        description="Start only the OpenAI-compatible frontend against a running tritonserver "
        "(e.g. `tritonserver --model-repository model_repository`). It keeps no state, so several "
        "can serve one Triton, or one per Triton behind a load balancer.",
    )
    target = frontend.add_argument_group("Triton")
    target.add_argument("--triton-url", required=True, metavar="HOST:PORT", help="Triton's gRPC address")
    target.add_argument(
        "--triton-model", default="triton_chat", metavar="NAME", help="the Triton model name (default: triton_chat)"
    )
    target.add_argument("--served-model-name", required=True, metavar="NAME", help="the `model` name clients send")
    target.add_argument(
        "--triton-metrics-url",
        default="",
        metavar="URL",
        help="Triton's metrics endpoint (e.g. http://127.0.0.1:8002/metrics): /metrics then shows the engine's "
        "running, waiting and KV-cache figures too",
    )
    add_http_flags(frontend.add_argument_group("HTTP frontend"))
    return parser


def parse_args(
    argv: list[str],
) -> ServeOptions | FrontendOptions | RepositoryOptions | TritonServerArgs | WorkerOptions:
    """Parse the command line; usage errors exit with status 2 like any argparse error."""
    if argv[:1] == ["tritonserver"]:
        # Everything after it is tritonserver's, --help included.
        return TritonServerArgs(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve" and args.headless:
        parser = build_parser(_config_defaults(argv))  # --config's values count for a worker too
        return _worker_options(parser, parser.parse_args(argv), "triton-chat serve --headless")
    if args.command == "serve":
        return parse_serve_args(argv)
    if args.command == "worker":
        return _worker_options(parser, args, "triton-chat worker")
    if args.command == "repository":
        return _repository_options(parser, args)
    args.api_keys = api_keys_with_environment(args.api_keys, os.environ)
    check_http_flags(parser, args)
    return FrontendOptions(
        triton_url=args.triton_url,
        triton_model=args.triton_model,
        served_model_name=args.served_model_name,
        triton_metrics_url=args.triton_metrics_url,
        **_http_options(args),
    )


def _http_options(args: argparse.Namespace) -> dict[str, Any]:
    """The HTTP frontend's options from its flags (``add_http_flags``), the same for ``serve`` and
    ``frontend``: both options dataclasses take them under these names, from this one mapping."""
    return {
        "host": args.host,
        "port": args.port,
        "openai_mode": args.openai_mode,
        "full_text": args.full_text,
        "api_keys": tuple(args.api_keys),
        "strict_params": args.strict_params,
        "tls": TlsFiles(args.tls_cert, args.tls_key, args.tls_ca_cert) if args.tls_cert else None,
        "drain_timeout_s": args.drain_timeout,
        "token_timeout_s": args.token_timeout,
        "e2e_timeout_s": args.e2e_timeout,
        "response_channel": args.response_channel,
        "http_limits": http_limits(args),
        "operations": operations_options(args),
        "metrics_vllm_names": args.metrics_vllm_names,
        "log_level": args.log_level,
        "media_root": args.allowed_local_media_path,
    }


def lora_module(item: str) -> tuple[str, str] | None:
    """One ``--lora-modules`` value: ``NAME=DIR`` or vLLM's ``{"name": NAME, "path": DIR}``; None
    when it is neither. vLLM's ``base_model_name`` is refused, not ignored: every adapter here
    applies to the one served model, and /v1/models names it as the parent already."""
    if item.lstrip().startswith("{"):
        try:
            entry = json.loads(item)
        except json.JSONDecodeError:
            return None
        name, folder = entry.get("name"), entry.get("path")
        if set(entry) - {"name", "path"} or not isinstance(name, str) or not isinstance(folder, str):
            return None
    else:
        name, _, folder = item.partition("=")
    return (name, folder) if name and folder else None


LORA_FORMS = 'NAME=DIR or {"name": NAME, "path": DIR}'


def _repository_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> RepositoryOptions:
    engine = engine_values(parser, args)
    lora_modules: dict[str, str] = {}
    for item in args.lora_modules:
        module = lora_module(item)
        if module is None:
            parser.error(f"--lora-modules takes {LORA_FORMS}, got '{item}'")
        name, folder = module
        lora_modules[name] = str(Path(folder).expanduser().resolve())
    try:
        EngineSettings(**{**engine.flags, **engine.overrides})  # type: ignore[arg-type]
    except SettingsError as exc:
        parser.error(str(exc))
    return RepositoryOptions(
        dest=args.dest,
        model=args.model_path,
        model_origin="--model",
        served_model_name=args.served_model_name,
        engine_flags=engine.flags,
        engine_overrides=engine.overrides,
        lora_modules=lora_modules,
        instances=args.instances or 1,
    )


def _config_path(argv: list[str]) -> Path | None:
    finder = argparse.ArgumentParser(add_help=False)
    finder.add_argument("--config", type=Path)
    known, _ = finder.parse_known_args(argv)
    return known.config if isinstance(known.config, Path) else None


def _origin(argv: list[str], flag: str, config: Path | None, key: str) -> str:
    """Where a value came from, for error messages: the flag, else the config.json key that set it."""
    given = any(arg == flag or arg.startswith(flag + "=") for arg in argv)
    return flag if given or config is None else f"{config} ModelConfig.{key}"


def _config_defaults(argv: list[str]) -> dict[str, Any] | None:
    """The flag defaults from ``--config FILE`` when it is given (read before the real parse)."""
    config = _config_path(argv)
    if config is None:
        return None
    try:
        return flag_defaults(load_server_file(config))
    except ConfigFileError as exc:
        build_parser().error(str(exc))
    return None


def _worker_options(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> WorkerOptions:
    """``worker`` (or ``serve --headless``): a node other than 0, with valid settings."""
    if args.lora_modules:
        parser.error("--lora-modules: a model over several nodes (tensor parallel) runs no LoRA adapters")
    engine = engine_values(parser, args)
    values: dict[str, str | bool | int] = {**engine.flags, **engine.overrides}
    if args.served_model_name:
        values["served_model_name"] = args.served_model_name
    try:
        check_dtype_name(str(values["dtype"]), "--dtype")
        settings = EngineSettings(**values)  # type: ignore[arg-type]
    except (SettingsError, ModelFolderError) as exc:
        parser.error(str(exc))
    if settings.nnodes < 2 or settings.node_rank < 1:
        parser.error(
            f"{command} runs a node other than node 0 of a model over several nodes: it needs --nnodes >= 2 and "
            f"--node-rank 1 to nnodes - 1 (got --nnodes {settings.nnodes}, --node-rank {settings.node_rank}); "
            "node 0 runs `triton-chat serve`"
        )
    return WorkerOptions(model=args.model_path, values=values)


def parse_serve_args(argv: list[str]) -> ServeOptions:
    """Parse ``serve ...`` arguments (not ``--headless``: ``parse_args`` makes those a worker);
    usage errors exit with status 2 like any argparse error."""
    parser = build_parser(_config_defaults(argv))
    args = parser.parse_args(argv)
    if args.headless:
        parser.error("serve --headless runs a worker node: parse it with parse_args")
    args.api_keys = api_keys_with_environment(args.api_keys, os.environ)
    check_http_flags(parser, args)
    if args.ready_timeout <= 0:
        parser.error("--ready-timeout must be > 0")
    listen = triton_listen(parser, args)
    engine = engine_values(parser, args)
    lora_modules: dict[str, str] = {}
    config = _config_path(argv)
    given = any(flag in argv for flag in ("--lora-modules", "--lora-module"))
    lora_origin = "--lora-modules" if config is None or given else f"{config} LoraModules"
    for item in args.lora_modules:
        module = lora_module(item)
        if module is None:
            parser.error(f"{lora_origin} takes {LORA_FORMS}, got '{item}'")
        name, folder = module
        if name in lora_modules:
            parser.error(f"{lora_origin}: the name '{name}' is given twice")
        if not (Path(folder).expanduser() / "adapter_config.json").is_file():
            parser.error(f"{lora_origin} {name}: '{folder}' is not a PEFT adapter folder (no adapter_config.json)")
        lora_modules[name] = str(Path(folder).expanduser().resolve())
    dtype_origin = _origin(argv, "--dtype", config, "dtype")
    try:
        # The same checks the model runs, here so that a typo fails now and not after the load.
        check_dtype_name(str(engine.flags["dtype"]), dtype_origin)
        values: dict[str, Any] = {**engine.flags, **engine.overrides}
        settings = EngineSettings(**values)
    except (SettingsError, ModelFolderError) as exc:
        parser.error(str(exc))
    if settings.node_rank > 0:
        parser.error(
            f"--node-rank {settings.node_rank}: only node 0 serves; run `triton-chat worker` (or `serve "
            "--headless`) with the same flags on the other nodes"
        )
    return ServeOptions(
        model=args.model_path,
        model_origin=_origin(argv, "--model", config, "modelWeightPath"),
        device_origin=_origin(argv, "--device", config, "device"),
        dtype_origin=dtype_origin,
        served_model_name=args.served_model_name,
        allow_external=args.allow_external,
        engine_overrides=engine.overrides,
        engine_flags=engine.flags,
        lora_modules=lora_modules,
        ready_timeout_s=args.ready_timeout,
        max_restarts=args.max_restarts,
        triton_log=args.triton_log,
        triton_log_max_mb=args.triton_log_max_mb,
        triton_listen=listen,
        instances=args.instances,
        **_http_options(args),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``triton-chat`` console script."""
    options = parse_args(sys.argv[1:] if argv is None else argv)
    if isinstance(options, TritonServerArgs | RepositoryOptions):
        configure_launcher_logging(logger, "text")
        return _own_triton(options)
    if isinstance(options, WorkerOptions):
        configure_launcher_logging(logger, "text")
        return run_worker(options)
    configure_launcher_logging(logger, options.operations.log_format, options.log_level)
    # Imported here: they pull in uvicorn and the app, which `--help` and usage errors do not need.
    if isinstance(options, FrontendOptions):
        from openai_frontend.launcher.frontend_only import run_frontend

        return run_frontend(options)
    from openai_frontend.launcher.serve import run_serve

    return run_serve(options)


def _own_triton(options: TritonServerArgs | RepositoryOptions) -> int:
    from openai_frontend.launcher.own_triton import run_tritonserver, write_repository

    try:
        if isinstance(options, TritonServerArgs):
            return run_tritonserver(options.args)
        model_dir = write_repository(options)
    except OWN_TRITON_ERRORS as exc:
        logger.error("%s", exc)
        return 1
    logger.info(
        "wrote %s for %s; run it with: triton-chat tritonserver --model-repository %s",
        options.dest / "triton_chat",
        model_dir,
        options.dest,
    )
    return 0
