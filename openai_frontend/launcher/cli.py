"""The ``triton-chat`` console script: ``main``, which runs the command the line asked for.

Owns ``main`` (logging set up, then ``serve``, ``frontend``, ``worker``, ``repository`` or
``tritonserver``) and which errors of the own-Triton commands it reports as one line. The
parser's definition is ``cli_parser``'s (``build_parser``) and parsing into options
``cli_options``'s (``parse_args``, ``parse_serve_args``); all three are re-exported here for the
callers that import them from ``cli``. May import those two, the options, logging and what each command runs;
the modules that pull in uvicorn and the app are imported only when their command runs.
"""

from __future__ import annotations

import logging
import sys

from openai_frontend.launcher.cli_options import parse_args as parse_args
from openai_frontend.launcher.cli_options import parse_serve_args as parse_serve_args
from openai_frontend.launcher.cli_parser import build_parser as build_parser
from openai_frontend.launcher.demo_model import DemoModelError
from openai_frontend.launcher.log_format import configure_launcher_logging
from openai_frontend.launcher.model_check import ModelFolderError
from openai_frontend.launcher.model_repo import ModelRepositoryError
from openai_frontend.launcher.options import FrontendOptions, RepositoryOptions, TritonServerArgs
from openai_frontend.launcher.triton_install import TritonInstallError
from openai_frontend.launcher.worker import WorkerOptions, run_worker
from python_backend.protocol.settings import SettingsError

logger = logging.getLogger("openai_frontend.launcher")

# What the own-Triton commands report as one line, without a traceback.
OWN_TRITON_ERRORS = (
    DemoModelError,
    FileExistsError,
    ModelFolderError,
    ModelRepositoryError,
    SettingsError,
    TritonInstallError,
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
