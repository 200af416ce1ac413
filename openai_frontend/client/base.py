"""The seam between the HTTP layer and the model: ``ChatBackend`` and what crosses it.

Owns: the ``ChatBackend`` protocol (implemented by ``client.triton.TritonBackend`` in production
and by scripted fakes in tests), the ``BackendRequest`` it takes, the ``BackendError`` it raises,
and ``close_stream``, the one way callers end a backend stream early. Nothing here knows HTTP or
gRPC; deltas and errors are the contract's types (``python_backend.protocol.contract``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import anyio

from python_backend.protocol import errors
from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.errors import ErrorInfo
from python_backend.protocol.tokenize import DetokenizeAnswer, DetokenizeQuery, TokenizeAnswer, TokenizeQuery


class BackendError(Exception):
    """An error reported by (or about) the model backend; carries the user-facing error."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


def backend_unavailable() -> BackendError:
    """The one message for "cannot reach the model": never addresses or Triton internals."""
    return BackendError(errors.backend_unavailable())


@dataclass(frozen=True)
class BackendRequest:
    """One chat request as the backend receives it (the tensor contract's inputs)."""

    request_id: str  # also the Triton request id, so logs on both sides correlate
    messages: list[dict[str, Any]]  # validated OpenAI chat messages (ignored when a prompt is set)
    parameters: dict[str, Any]  # the ``generation_parameters`` tensor: ``GenerationParams.to_wire()``
    # The client's own ``stream``: deltas as they come for streams, one whole answer per choice
    # otherwise (fewer responses; a disconnect still cancels, since the gRPC call stays open).
    stream: bool = True
    media: list[tuple[bytes, str]] = field(default_factory=list)  # (raw bytes, MIME type) per item
    prompt: str | None = None  # a raw prompt (``text_input``, no chat template) instead of messages
    prompt_token_ids: tuple[int, ...] | None = None  # or a prompt as token ids (``prompt_token_ids``)
    counts_every_response: bool = False  # token counts in every response, not only a choice's last


@runtime_checkable
class ChatBackend(Protocol):
    """What the routes need from a model backend.

    ``generate`` is an async generator function: it yields decoded deltas (one choice each, in
    arrival order, interleaved for n > 1) and raises ``BackendError`` for errors from the model.
    Closing the generator early (``aclose``, or cancelling the task iterating it) must cancel the
    request in the backend.
    """

    def generate(self, req: BackendRequest) -> AsyncGenerator[ChoiceDelta, None]: ...

    async def tokenize(self, query: TokenizeQuery) -> TokenizeAnswer:
        """The model's token ids for a prompt or chat messages (no generation)."""
        ...

    async def detokenize(self, query: DetokenizeQuery) -> DetokenizeAnswer:
        """The model's text for token ids; ``BackendError`` (400) for ids outside its vocabulary."""
        ...

    async def is_ready(self) -> bool: ...

    async def close(self) -> None: ...


async def close_stream(stream: AsyncGenerator[ChoiceDelta, None]) -> None:
    """Close a backend stream even from a cancelled task.

    Shielded because the usual reason to close early is cancellation (client disconnect), and
    under anyio a cancelled scope would abort the close before the backend heard about it.
    """
    with anyio.CancelScope(shield=True):
        await stream.aclose()
