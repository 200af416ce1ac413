"""From the ``triton-chat`` command line to options: ``parse_args`` and ``parse_serve_args``.

Owns parsing ``argv`` with ``cli_parser``'s parser, the ``--config`` file's values as flag
defaults, the checks that need several flags or the filesystem (LoRA adapter folders, dtype,
engine settings, node ranks), and building the options dataclasses of ``options.py`` (and
``worker.py``'s ``WorkerOptions``). Usage errors exit with status 2 through argparse. Binding the
frontend to anything but loopback needs ``--allow-external``, so exposing the server is always a
deliberate choice. May import the flag modules, ``options``, ``server_config`` and the backend's
``protocol`` settings; nothing that starts a process or the HTTP app.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from openai_frontend.launcher.cli_parser import build_parser
from openai_frontend.launcher.dtype_check import check_dtype_name
from openai_frontend.launcher.engine_flags import engine_values
from openai_frontend.launcher.http_flags import (
    api_keys_with_environment,
    check_http_flags,
    http_limits,
    operations_options,
)
from openai_frontend.launcher.model_check import ModelFolderError
from openai_frontend.launcher.options import (
    FrontendOptions,
    RepositoryOptions,
    ServeOptions,
    TlsFiles,
    TritonServerArgs,
)
from openai_frontend.launcher.server_config import ConfigFileError, flag_defaults, load_server_file
from openai_frontend.launcher.triton_flags import triton_listen
from openai_frontend.launcher.worker import WorkerOptions
from python_backend.protocol.settings import EngineSettings, SettingsError


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
