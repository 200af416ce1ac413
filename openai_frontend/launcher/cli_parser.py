"""The ``triton-chat`` command line's definition: ``build_parser``, every subcommand and flag.

Owns ``build_parser`` (the subcommands ``serve``, ``tritonserver``, ``repository``, ``worker`` and
``frontend`` with their flags and help) and the defaults it shows. Turning parsed flags into
options is ``cli_options``'s; running them is ``cli``'s. May import the modules that declare
flag groups (``engine_flags``, ``http_flags``, ``triton_flags``) and those whose constants it
shows as defaults; it runs nothing itself: ``config_docs`` and ``--help`` only read this parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from openai_frontend.launcher.engine_flags import add_engine_flags, positive_int
from openai_frontend.launcher.http_flags import add_http_flags, non_negative_int, with_default
from openai_frontend.launcher.log_rotation import BACKUPS, DEFAULT_MAX_MB
from openai_frontend.launcher.supervisor import MAX_RESTARTS
from openai_frontend.launcher.triton_flags import add_triton_listen_flags

DEFAULT_READY_TIMEOUT_S = 600.0
HEADLESS_HELP = (
    "run this node's tensor-parallel ranks only, as `triton-chat worker` (a node other than 0 of --nnodes; "
    "no tritonserver, no HTTP frontend)"
)
INSTANCES_HELP = (
    "model instances (instance_group count), each its own engine, Triton spreading requests over them "
    "(default: config.pbtxt's, 1); helps with one instance per GPU/NPU, not on one CPU"
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
