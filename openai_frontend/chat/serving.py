"""Runs one validated chat request against the backend and shapes the answer.

Owns: the request id and timestamp, the ``BackendRequest``, non-streaming aggregation
(``complete``, over ``collect_choices``), and the streaming path: ``start_stream`` (over
``start_events``, which any endpoint's ``EventFormatter`` can use) pulls deltas until the first SSE event
exists (so an error before any byte is still an HTTP error with the envelope), then ``events``
yields the rest and turns a later error into the stream's error ending; ``paced`` holds a stream
to the token timeout; ``keepalive_events`` is the stream whose headers go out at once, with comment
lines until its first event (``--sse-keepalive``). Every path closes the backend stream (``close_stream``), which cancels the
request in Triton when it ends early. A non-streaming answer arrives whole (one response per
choice), so only the end-to-end timeout (the gRPC deadline, ``triton_client``) bounds it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from openai_frontend.aio import within
from openai_frontend.chat.accumulate import ChoiceAccumulator
from openai_frontend.chat.echo import with_echo
from openai_frontend.chat.responses import completion_body
from openai_frontend.chat.sse import StreamFormatter, StreamOptions, keepalive_until
from openai_frontend.chat.validation import ValidatedChat
from openai_frontend.client.base import BackendError, BackendRequest, ChatBackend, close_stream
from openai_frontend.http.drain import DRAINING, DrainState
from openai_frontend.http.metrics import ChatObservation
from openai_frontend.settings import FrontendSettings
from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.errors import ErrorInfo, backend_incomplete, internal, token_timeout

logger = logging.getLogger(__name__)

INTERNAL_ERROR = internal()
EARLY_END = backend_incomplete()


async def paced(stream: AsyncGenerator[ChoiceDelta, None], timeout_s: float) -> AsyncGenerator[ChoiceDelta, None]:
    """The backend stream's deltas, each within ``timeout_s`` of the one before (or of the start).

    MindIE's ``tokenTimeout`` for streams: a backend that stops producing (a stalled engine, a
    request left in the queue) ends the request with a 504, or the stream's error event once it
    has started, and closing the backend stream cancels the request in Triton. Only the wait for
    the backend counts, not the time spent writing to a slow client. With ``--stream-interval N``
    the wait is for the next response, N tokens.
    """
    try:
        while True:
            try:
                delta = await _next_within(stream, timeout_s)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise BackendError(token_timeout(timeout_s)) from None
            yield delta
    finally:
        await close_stream(stream)


async def _next_within(stream: AsyncGenerator[ChoiceDelta, None], timeout_s: float) -> ChoiceDelta:
    # The timeout covers only this await, never the consumer's time between deltas. On expiry
    # the backend stream is cancelled at its await (its cleanup cancels the request in Triton) and
    # no cancellation is left pending in the task, whichever task iterates (the request's, then
    # the response's: start_stream). asyncio.timeout does that with one timer per delta;
    # ``within``, before Python 3.11, also runs each delta in a task of its own, a cost per token.
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await anext(stream)
    return await within(anext(stream), timeout_s)


def new_request_id(prefix: str = "chatcmpl") -> str:
    """``chatcmpl-<uuid4 hex>``: OpenAI's id shape (MindIE's ``endpoint_common_<N>`` is a counter,
    which would need shared state across frontend replicas)."""
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ChatCall:
    """One request on its way to the backend."""

    chat: ValidatedChat
    settings: FrontendSettings
    observation: ChatObservation  # what the answer adds to the metrics
    media: list[tuple[bytes, str]] = field(default_factory=list)  # loaded ``chat.media``, same order
    request_id: str = field(default_factory=new_request_id)
    created: int = field(default_factory=lambda: int(time.time()))
    # Triton's request id when it must differ from ``request_id`` (a client's X-Request-Id may
    # repeat, and two requests in the model must not share one); "": ``request_id``.
    backend_id: str = ""

    def backend_request(self) -> BackendRequest:
        # A non-streaming answer is asked for whole: one response per choice instead of one per
        # token saves every serving process its per-token work (IPC, gRPC, decoding).
        return BackendRequest(
            self.backend_id or self.request_id, self.chat.messages, self.chat.params.to_wire(), stream=self.chat.stream,
            media=list(self.media), counts_every_response=self.chat.continuous_usage,
        )  # fmt: skip

    @property
    def pseudo_stream(self) -> bool:
        """A streaming beam search answers one whole ``chat.completion`` (MindIE mode)."""
        return self.chat.stream and self.chat.params.use_beam_search and self.settings.mindie_mode


async def collect_choices(
    stream: AsyncGenerator[ChoiceDelta, None], observation: ChatObservation, choices: int
) -> list[ChoiceAccumulator]:
    """Every choice of a whole answer (indices 0..choices-1), each finished, or ``EARLY_END``."""
    found: dict[int, ChoiceAccumulator] = {}
    try:
        async for delta in stream:
            observation.on_delta(delta, streamed=False)
            found.setdefault(delta.index, ChoiceAccumulator(delta.index)).add(delta)
    finally:
        await close_stream(stream)
    if not set(range(choices)) <= set(found) or not all(c.finished for c in found.values()):
        raise BackendError(EARLY_END)
    observation.succeeded()
    return list(found.values())


async def complete(backend: ChatBackend, call: ChatCall) -> dict[str, Any]:
    """The whole ``chat.completion`` body, aggregated from the backend's deltas."""
    stream = with_echo(backend.generate(call.backend_request()), call.chat.echo)
    choices = await collect_choices(stream, call.observation, call.chat.params.n)
    return completion_body(
        request_id=call.request_id,
        created=call.created,
        model=call.chat.request.model,
        choices=choices,
        logprobs=call.chat.params.logprobs,
        mindie=call.settings.mindie_mode,
    )


class EventFormatter(Protocol):
    """Turns one request's backend deltas into its SSE events (``sse.StreamFormatter`` for chat)."""

    error: ErrorInfo | None  # what ended the stream, when an error did

    def on_delta(self, delta: ChoiceDelta) -> list[bytes]: ...

    def on_end(self) -> list[bytes]: ...

    def on_error(self, info: ErrorInfo) -> list[bytes]: ...


@dataclass
class StartedStream:
    """A backend stream whose first SSE events are ready: nothing has been sent yet."""

    first_events: list[bytes]
    backend_stream: AsyncGenerator[ChoiceDelta, None]
    formatter: EventFormatter
    observation: ChatObservation


def _formatter(call: ChatCall) -> StreamFormatter:
    params = call.chat.params
    return StreamFormatter(
        StreamOptions(
            request_id=call.request_id,
            created=call.created,
            model=call.chat.request.model,
            n=params.n,
            logprobs=params.logprobs,
            mindie=call.settings.mindie_mode,
            full_text=call.settings.full_text_enabled,
            include_usage=call.chat.include_usage,
            continuous_usage=call.chat.continuous_usage,
        )
    )


async def start_stream(backend: ChatBackend, call: ChatCall) -> StartedStream:
    """Wait for the first deltas that produce an event; backend errors here propagate (HTTP error)."""
    stream = paced(with_echo(backend.generate(call.backend_request()), call.chat.echo), call.settings.token_timeout_s)
    return await start_events(stream, _formatter(call), call.observation)


async def start_events(
    stream: AsyncGenerator[ChoiceDelta, None], formatter: EventFormatter, observation: ChatObservation
) -> StartedStream:
    """``start_stream`` for any endpoint's formatter: ``stream`` is already ``paced``."""
    try:
        async for delta in stream:
            observation.on_delta(delta, streamed=True)
            events = formatter.on_delta(delta)
            if events:
                return StartedStream(events, stream, formatter, observation)
    except BaseException:
        await close_stream(stream)
        raise
    await close_stream(stream)
    # Every choice's last delta makes an event, so a stream that ended without one ended early.
    raise BackendError(EARLY_END)


async def events(started: StartedStream, drain: DrainState | None = None) -> AsyncGenerator[bytes, None]:
    """All SSE events of a started stream; errors from here on end the stream, not the response.

    A stream still open when a graceful drain's time is up ends with the drain's error (and the
    request is cancelled in the backend), so the client knows it was cut, rather than seeing the
    connection drop.
    """
    formatter, observation = started.formatter, started.observation
    try:
        for event in started.first_events:
            yield event
        try:
            tail: list[bytes] | None = None
            async for delta in started.backend_stream:
                observation.on_delta(delta, streamed=True)
                for event in formatter.on_delta(delta):
                    yield event
                if drain is not None and drain.expired():
                    tail = formatter.on_error(DRAINING)
                    break
            if tail is None:
                tail = formatter.on_end()
        except BackendError as exc:
            logger.info("stream ended by backend error: %s", exc.info.message)
            tail = formatter.on_error(exc.info)
        except Exception:
            # Headers are sent; the error can only travel in the stream. Logged with its traceback.
            logger.exception("stream failed")
            tail = formatter.on_error(INTERNAL_ERROR)
        for event in tail:
            yield event
        if formatter.error is None:
            observation.succeeded()
        else:
            observation.failed_in_stream(formatter.error.status)
    finally:
        observation.cancelled_in_stream()  # unless it ended above: then this does nothing
        await close_stream(started.backend_stream)


async def keepalive_events(
    backend: ChatBackend, call: ChatCall, interval_s: float, drain: DrainState | None = None
) -> AsyncGenerator[bytes, None]:
    """``events``, for a response whose headers were sent before the backend answered: a
    ``: keep-alive`` comment every ``interval_s`` until the first event, and an error before it
    (a full queue, a token timeout) as the stream's error ending instead of an HTTP status."""
    start = asyncio.ensure_future(start_stream(backend, call))
    try:
        async for comment in keepalive_until(start, interval_s):
            yield comment
    except BaseException:  # closed or cancelled while waiting: the client left
        await _abandon(start)
        call.observation.cancelled_in_stream()
        raise
    try:
        started = start.result()
    except BackendError as exc:
        logger.info("stream ended by backend error before its first event: %s", exc.info.message)
        failure = exc.info
    except Exception:
        logger.exception("stream failed before its first event")
        failure = INTERNAL_ERROR
    else:
        async for event in events(started, drain):
            yield event
        return
    call.observation.failed_in_stream(failure.status)
    for event in _formatter(call).on_error(failure):
        yield event


async def _abandon(start: asyncio.Future[StartedStream]) -> None:
    """Stop waiting for a stream's start; its backend stream is closed however far it got."""
    with anyio.CancelScope(shield=True):
        if not start.done():
            start.cancel()  # start_stream closes the backend stream on its way out
            await asyncio.wait({start})
        if not start.cancelled() and start.exception() is None:
            await close_stream(start.result().backend_stream)
