"""``triton-chat frontend``: the HTTP frontend alone, in front of a tritonserver someone else runs.

Owns turning ``FrontendOptions`` into ``FrontendSettings`` and running uvicorn until Ctrl-C or
SIGTERM (after a drain: ``draining_server``). Unlike ``serve``, it starts no tritonserver: ``/health/ready``
reports whether the Triton model behind it is ready.
"""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType

from openai_frontend.app import create_app
from openai_frontend.launcher.draining_server import draining_server
from openai_frontend.launcher.options import FrontendOptions, http_settings, media_settings
from openai_frontend.launcher.triton_metrics import metrics_reader
from openai_frontend.settings import FrontendSettings

logger = logging.getLogger("openai_frontend.launcher")


def frontend_settings(options: FrontendOptions) -> FrontendSettings:
    return FrontendSettings.model_validate(
        {
            "triton_grpc_url": options.triton_url,
            "triton_model_name": options.triton_model,
            "served_model_name": options.served_model_name,
            **http_settings(options),
            "media": media_settings(options, os.environ),
        }
    )


def run_frontend(options: FrontendOptions) -> int:
    reader = metrics_reader(options.triton_metrics_url) if options.triton_metrics_url else None
    app = create_app(frontend_settings(options), engine_metrics=reader)
    shown_host = f"[{options.host}]" if ":" in options.host else options.host
    logger.info(
        "serving '%s' at %s://%s:%d/v1 (Triton gRPC at %s, model %s)",
        options.served_model_name,
        "https" if options.tls else "http",
        shown_host,
        options.port,
        options.triton_url,
        options.triton_model,
    )
    server = draining_server(app, options.host, options.port, options.tls, options.drain_timeout_s, options.log_level)

    def stop(signum: int, frame: FrameType | None) -> None:
        server.should_exit = True

    # uvicorn handles SIGINT/SIGTERM while it runs, then restores these handlers and re-raises
    # the signal it caught: with ours in place that ends in a clean exit status 0.
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else 1
