"""The launcher's own HTTP calls to a tritonserver listener, TCP or Unix socket alike.

Owns ``http_call`` (one request, its ``HttpAnswer``) and ``HttpCallError`` (no answer at all).
urllib cannot reach a Unix socket, and tritonserver's listeners are Unix sockets unless the user
asked for ports (``triton_endpoints``), so the readiness polls, the model's health probe, the
version read and the metrics reads all go through here.
"""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass

from openai_frontend.launcher.triton_endpoints import Listener

MAX_ANSWER_BYTES = 16 * 1024 * 1024  # Triton's /metrics is the largest answer read here


class HttpCallError(OSError):
    """No HTTP answer: not listening (yet), refused, or silent past the timeout."""


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: bytes


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection over a Unix socket (the Host header names localhost)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def http_call(
    listener: Listener,
    path: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float,
) -> HttpAnswer:
    """GET ``path`` (POST when there is a ``body``); any status is an answer, none is an error."""
    socket_path = listener.socket_path
    connection = (
        _UnixConnection(socket_path, timeout)
        if socket_path is not None
        else http.client.HTTPConnection(listener.host.strip("[]"), listener.port, timeout=timeout)
    )
    try:
        connection.request("POST" if body is not None else "GET", path, body=body, headers=headers or {})
        response = connection.getresponse()
        return HttpAnswer(response.status, response.read(MAX_ANSWER_BYTES))
    except (OSError, http.client.HTTPException) as exc:
        raise HttpCallError(f"{listener.http_url(path)}: {exc}") from exc
    finally:
        connection.close()
