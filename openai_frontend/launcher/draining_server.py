"""uvicorn's server with a graceful drain on SIGTERM.

Owns ``DrainingServer`` and ``draining_server``, the one way both commands build it. Kubernetes
(and most process managers) stop a pod with SIGTERM and give it a grace period. On the first
SIGTERM this server keeps its socket open, turns readiness to 503 and new inference requests to
503 with ``Retry-After`` (``openai_frontend.http.drain``), and lets the requests in flight finish; it
stops once none is left or ``drain_timeout_s`` has passed (streams still open then end with an
error event, ``drain.EXPIRY_GRACE_S``). Then uvicorn's own shutdown runs, bounded by
``SHUTDOWN_GRACE_S``: a stream still open at that point is cut. SIGINT (Ctrl-C) and a second
signal stop at once, as before; a drain timeout of 0 turns the drain off.
"""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from openai_frontend.http.drain import DrainState
from openai_frontend.http.limits import limited_protocol
from openai_frontend.launcher.log_format import DEFAULT_LOG_LEVEL, uvicorn_log_config
from openai_frontend.launcher.options import TlsFiles, uvicorn_tls

# uvicorn's wait for open connections once the drain is over (its default waits for every stream).
SHUTDOWN_GRACE_S = 1

logger = logging.getLogger("openai_frontend.launcher")  # the launcher's user-facing messages


class DrainingServer(uvicorn.Server):
    """A ``uvicorn.Server`` that drains on the first SIGTERM."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain: DrainState,
        drain_timeout_s: float,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self._drain = drain
        self._drain_timeout_s = drain_timeout_s
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_started is not None:
            self._on_started()  # listening, the app's start-up done: what `serve` calls "frontend ready"

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._drain_timeout_s > 0 and not (self._drain.draining or self.should_exit):
            self._drain.begin(self._drain_timeout_s)  # on_tick stops the server when it is done
            logger.info(
                "SIGTERM: draining %d request(s) in flight for up to %g s (again to stop at once)",
                self._drain.in_flight,
                self._drain_timeout_s,
            )
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        # Every 0.1 s: the process stops within a tick of its last request ending.
        if self._drain.done() and not self.should_exit:
            if self._drain.in_flight:
                logger.warning("drain timeout: stopping with %d request(s) in flight", self._drain.in_flight)
            self.should_exit = True
        return await super().on_tick(counter)


def draining_server(
    app: FastAPI,
    host: str,
    port: int,
    tls: TlsFiles | None,
    drain_timeout_s: float,
    log_level: str = DEFAULT_LOG_LEVEL,
    on_started: Callable[[], None] | None = None,
) -> DrainingServer:
    """The server for an app made by ``create_app`` (whose state holds the drain and the settings);
    ``on_started`` is called once it listens."""
    log_config = uvicorn_log_config(app.state.frontend.settings.log_format, log_level)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        loop="asyncio",  # the loop grpc.aio is built and tested on (uvloop, if installed, would be picked)
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        # Header size, count and deadline, the connection cap, and protocol errors in the envelope.
        http=limited_protocol(app.state.frontend.settings.http_limits),
        **uvicorn_tls(tls),
        log_config=log_config if log_config is not None else uvicorn.config.LOGGING_CONFIG,
    )
    return DrainingServer(config, app.state.frontend.drain, drain_timeout_s, on_started)
