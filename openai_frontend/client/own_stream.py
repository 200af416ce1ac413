"""A channel-bound request's own stream (``client.triton``): read by a task of its own, it
carries only the request's error or its end, while the deltas come over the response channel.

Owns ``OwnStream`` and ``rpc_error``, the mapping of a failed gRPC call to the user's error (the
end-to-end timeout, else ``backend_unavailable``, with the details in one log line).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from openai_frontend.aio import within
from openai_frontend.client.base import BackendError, backend_unavailable
from openai_frontend.client.channel import ChannelLost
from openai_frontend.client.connection import is_unreachable, rpc_summary
from openai_frontend.client.health import BackendHealth
from openai_frontend.client.reads import GuardedReads
from python_backend.protocol.errors import ErrorInfo, e2e_timeout

logger = logging.getLogger(__name__)

STREAM_ENDED = object()  # put on the queue: the stream ended without an error
LAST_ENTRY_WAIT_S = 5.0


def rpc_error(exc: grpc.RpcError, timeout_s: float, health: BackendHealth | None = None) -> BackendError:
    """The user's error for a failed call; an unreachable server also has ``health`` probed."""
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return BackendError(e2e_timeout(timeout_s))
    # Details (addresses, Triton internals) go to the log only; an outage is the health's one
    # warning, not one per request (an outage of seconds used to log thousands).
    if health is not None and is_unreachable(exc):
        health.suspect()
        logger.debug("Triton call failed: %s", rpc_summary(exc))
    else:
        logger.warning("Triton call failed: %s", rpc_summary(exc))
    return backend_unavailable()


class OwnStream:
    """A channel-bound request's own stream, read by a task of its own: it carries only an error
    (put on the queue as ``BackendError``) or the end; ``ended`` says the end came without one."""

    def __init__(
        self, reads: GuardedReads, queue: asyncio.Queue[Any], timeout_s: float, health: BackendHealth | None
    ) -> None:
        self.reads = reads
        self.ended = False
        self._queue = queue
        self._timeout_s = timeout_s
        self._health = health
        self.task: asyncio.Future[None] = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        failed = False
        try:
            async for _result, error in self.reads:
                if error is not None and not failed:
                    failed = True  # the request's last response; read on to the stream's end
                    self._queue.put_nowait(BackendError(ErrorInfo.from_wire(str(error))))
        except grpc.RpcError as exc:
            if not failed:
                self._queue.put_nowait(rpc_error(exc, self._timeout_s, self._health))
            return
        if not failed:
            self.ended = True
            self._queue.put_nowait(STREAM_ENDED)

    async def last_entry(self) -> Any:
        """The next item once the stream ended: the model flushed the channel before it sent the
        final flag, so the last entry is at most a message behind; if it never comes, the answer is lost."""
        try:
            return await within(self._queue.get(), LAST_ENTRY_WAIT_S)
        except asyncio.TimeoutError:
            return ChannelLost("the request's stream ended without its last entry on the channel")
