"""Runs one validated completions request against the backend and shapes the answer.

Owns: ``CompletionCall`` (one backend request per prompt: ``text_input``, or
``prompt_token_ids`` for token ids), ``fan_in`` (the prompts' streams as one, choice i*n+k being
prompt i's k-th), ``prompt_only`` (``echo`` with ``max_tokens`` 0: nothing generated is shown or
counted), ``echo_texts`` (token ids are echoed as the model detokenizes them),
``complete`` and ``start_stream``. A token-id prompt's errors name its place in the body
(``prompt.1.4``), not the tensor (``prompt_token_ids.4``).
The backend dialogue itself (collecting, pacing, the stream's start and its error ending) is
chat's (``chat.serving``); every backend stream is closed on every path, which cancels what is
still running in Triton.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from openai_frontend.chat.serving import StartedStream, collect_choices, new_request_id, paced, start_events
from openai_frontend.chat.sse import StreamOptions
from openai_frontend.client.base import BackendError, BackendRequest, ChatBackend, close_stream
from openai_frontend.completions.responses import OBJECT_TEXT_COMPLETION, text_completion_body
from openai_frontend.completions.sse import CompletionStreamFormatter
from openai_frontend.completions.validation import ValidatedCompletion
from openai_frontend.http.metrics import ChatObservation
from openai_frontend.settings import FrontendSettings
from python_backend.protocol.contract import FINISH_LENGTH, PROMPT_TOKEN_IDS, ChoiceDelta, ChoiceUsage
from python_backend.protocol.errors import ErrorInfo
from python_backend.protocol.tokenize import DetokenizeQuery


@dataclass(frozen=True)
class CompletionCall:
    """One completions request on its way to the backend."""

    completion: ValidatedCompletion
    settings: FrontendSettings
    observation: ChatObservation  # what the answer adds to the metrics
    request_id: str = field(default_factory=lambda: new_request_id("cmpl"))
    created: int = field(default_factory=lambda: int(time.time()))
    # Triton's request id when it must differ from ``request_id`` (a client's X-Request-Id may
    # repeat, and two requests in the model must not share one); "": ``request_id``.
    backend_id: str = ""

    def backend_requests(self) -> list[BackendRequest]:
        """One per prompt; the Triton request ids stay unique (``<id>-<prompt index>``)."""
        wire = self.completion.params.to_wire()
        prompts = self.completion.prompts
        base = self.backend_id or self.request_id
        return [
            BackendRequest(
                base if len(prompts) == 1 else f"{base}-{i}",
                [],
                wire,
                stream=self.completion.stream,
                prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=None if isinstance(prompt, str) else prompt,
                counts_every_response=self.completion.continuous_usage,
            )
            for i, prompt in enumerate(prompts)
        ]


def repoint(info: ErrorInfo, name: str, place: str) -> ErrorInfo:
    """``info`` naming ``place`` (the prompt's field in the body) where it names ``name`` (what
    the model calls the prompt's ids), in ``param`` and in the message alike."""
    param = info.param
    if param is None or not (param == name or param.startswith(f"{name}.")):
        return info
    moved = place + param[len(name) :]
    return replace(info, param=moved, message=info.message.replace(f"'{param}'", f"'{moved}'"))


async def _pointed(stream: AsyncGenerator[ChoiceDelta, None], place: str) -> AsyncGenerator[ChoiceDelta, None]:
    """A token-id prompt's stream, whose errors name the prompt's place in the body."""
    try:
        async for delta in stream:
            yield delta
    except BackendError as exc:
        raise BackendError(repoint(exc.info, PROMPT_TOKEN_IDS, place)) from exc
    finally:
        await close_stream(stream)


async def echo_texts(backend: ChatBackend, completion: ValidatedCompletion) -> tuple[str, ...]:
    """Each prompt's text as ``echo`` shows it ("" without echo): token ids as the model
    detokenizes them (special tokens kept, as vLLM echoes them)."""
    if not completion.echo:
        return tuple("" for _ in completion.prompts)
    texts: list[str] = []
    for prompt, place in zip(completion.prompts, completion.prompt_params, strict=True):
        if isinstance(prompt, str):
            texts.append(prompt)
            continue
        try:
            answer = await backend.detokenize(DetokenizeQuery(list(prompt)))
        except BackendError as exc:
            raise BackendError(repoint(exc.info, "tokens", place)) from exc
        texts.append(answer.prompt)
    return tuple(texts)


_END = object()


async def fan_in(
    streams: list[AsyncGenerator[ChoiceDelta, None]], per_prompt: int
) -> AsyncGenerator[ChoiceDelta, None]:
    """The deltas of all ``streams`` as they arrive, stream i's choice k renumbered i*per_prompt+k.

    The first error of any stream ends the whole (the others are cancelled), as one request's would.
    """
    if len(streams) == 1:
        try:
            async for delta in streams[0]:
                yield delta
        finally:
            await close_stream(streams[0])
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[ChoiceDelta, None]) -> None:
        try:
            async for delta in stream:
                await queue.put((i, delta))
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put((i, exc))
        else:
            await queue.put((i, _END))

    tasks = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                item.index = i * per_prompt + item.index
                yield item
    finally:
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)
            for stream in streams:
                await close_stream(stream)


def prompt_only(delta: ChoiceDelta) -> ChoiceDelta:
    """``delta`` of an ``echo`` request with ``max_tokens`` 0, with the token the engine had to
    generate (its contract's ``max_tokens`` is at least 1) left out: no text, logprobs or counted
    token, and ``length`` as the reason it ended (vLLM's answer). The prompt's scores and tokens,
    and the time to the first token (the prompt's prefill), stay."""
    usage = delta.usage
    if usage is not None:
        usage = ChoiceUsage(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=0,
            cached_tokens=usage.cached_tokens,
            prefill_time=usage.prefill_time,
        )
    return replace(
        delta,
        text="",
        reasoning="",
        tool_calls=[],
        logprobs=None,
        finish_reason=None if delta.finish_reason is None else FINISH_LENGTH,
        usage=usage,
        num_output_tokens=0,
        cumulative_logprob=0.0,
    )


async def _prompt_only(stream: AsyncGenerator[ChoiceDelta, None]) -> AsyncGenerator[ChoiceDelta, None]:
    try:
        async for delta in stream:
            yield prompt_only(delta)
    finally:
        await close_stream(stream)


def _backend_stream(backend: ChatBackend, call: CompletionCall) -> AsyncGenerator[ChoiceDelta, None]:
    c = call.completion
    streams = [
        backend.generate(request) if isinstance(prompt, str) else _pointed(backend.generate(request), place)
        for request, prompt, place in zip(call.backend_requests(), c.prompts, c.prompt_params, strict=True)
    ]
    merged = fan_in(streams, c.params.n)
    return _prompt_only(merged) if c.echo_only else merged


async def complete(backend: ChatBackend, call: CompletionCall) -> dict[str, Any]:
    """The whole ``text_completion`` body, aggregated from the backend's deltas."""
    c = call.completion
    echoed = await echo_texts(backend, c)
    choices = await collect_choices(_backend_stream(backend, call), call.observation, c.choices)
    return text_completion_body(
        request_id=call.request_id,
        created=call.created,
        model=c.request.model,
        choices=choices,
        prompts=echoed,
        echo=c.echo,
        logprobs=c.params.logprobs,
        mindie=call.settings.mindie_mode,
    )


async def start_stream(backend: ChatBackend, call: CompletionCall) -> StartedStream:
    """Wait for the first deltas that produce an event; backend errors here propagate (HTTP error)."""
    c = call.completion
    options = StreamOptions(
        request_id=call.request_id,
        created=call.created,
        model=c.request.model,
        n=c.choices,
        logprobs=c.params.logprobs,
        mindie=call.settings.mindie_mode,
        full_text=call.settings.full_text_enabled,
        include_usage=c.include_usage,
        continuous_usage=c.continuous_usage,
        object=OBJECT_TEXT_COMPLETION,
    )
    formatter = CompletionStreamFormatter(options, await echo_texts(backend, c), c.params.n, c.echo)
    stream = paced(_backend_stream(backend, call), call.settings.token_timeout_s)
    return await start_events(stream, formatter, call.observation)
