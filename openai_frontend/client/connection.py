"""The frontend's gRPC connection to tritonserver: its channel options, the liveness probe
``client.health`` runs over it, and one-line descriptions of failures.

Owns ``channel_args`` (tritonclient's options plus a short reconnect backoff), ``live_probe``
(``ServerLive`` with a deadline: whether tritonserver answers at all, not whether the model does)
and ``rpc_summary`` (a failed call as one log line: grpc.aio's own text is six, with addresses).
"""

from __future__ import annotations

from typing import Any

import grpc
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions
from tritonclient.utils import InferenceServerException

from openai_frontend.client.health import Probe

# Reconnect at most a second after tritonserver is back (gRPC's default backoff grows to 120 s):
# the launcher restarts a tritonserver whose model process died on the same port, and the first
# request after its model is ready should find the channel connected (the model restarts after a crash).
RECONNECT_BACKOFF_MS = 1000


def channel_args() -> list[tuple[str, Any]]:
    """tritonclient's own channel options (message sizes, keepalive) plus a short reconnect backoff."""
    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    ]


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no details"


def rpc_summary(exc: BaseException) -> str:
    """A failed gRPC call in one line: its status code and the first line of its details."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {_first_line(exc.details() or '')}"
    return _first_line(str(exc)) if str(exc) else type(exc).__name__


def is_unreachable(exc: BaseException) -> bool:
    """Whether a failed call says tritonserver may be gone (its health is then probed at once)."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


def live_probe(client: Any) -> Probe:
    """``ServerLive`` over ``client`` within ``timeout_s``: None when tritonserver said it is live."""

    async def probe(timeout_s: float) -> str | None:
        try:
            live = await client.is_server_live(client_timeout=timeout_s)
        except (InferenceServerException, grpc.RpcError, OSError) as exc:
            return rpc_summary(exc)
        return None if live else "tritonserver says it is not live"

    return probe
