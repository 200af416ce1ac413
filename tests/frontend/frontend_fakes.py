"""Scripted stand-ins for the model backend, and helpers to drive the app in-process.

``FakeBackend`` implements ``ChatBackend``: for each request it yields the deltas a script
returns (realistic ``ChoiceUsage`` included), raises scripted ``BackendError``s, and records how
each stream ended (finished, closed early, cancelled) so disconnect tests can assert on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from openai_frontend.app import create_app
from openai_frontend.client.base import BackendError, BackendRequest
from openai_frontend.settings import FrontendSettings
from python_backend.protocol.contract import ChoiceDelta, ChoiceUsage, TokenLogprob, TopLogprob
from python_backend.protocol.errors import ErrorInfo
from python_backend.protocol.tokenize import DetokenizeAnswer, DetokenizeQuery, TokenizeAnswer, TokenizeQuery

MODEL = "tiny-chat"
PROMPT_TOKENS = 9
MAX_MODEL_LEN = 2048

Script = Callable[[BackendRequest], Sequence[ChoiceDelta | BackendError]]


def usage_for(tokens: int, *, prompt: int = PROMPT_TOKENS, batch: int = 1, reasoning: int | None = None) -> ChoiceUsage:
    """Usage the way the engine reports it: one entry per token, tokens-1 decode steps."""
    return ChoiceUsage(
        prompt_tokens=prompt,
        completion_tokens=tokens,
        cached_tokens=0,
        reasoning_tokens=reasoning,
        batch_size=[batch] * tokens,
        queue_wait_time=[5000 + i for i in range(tokens)] if tokens else [],
        prefill_time=20.5 + tokens,
        decode_time_arr=[25.0 + i for i in range(max(tokens - 1, 0))],
    )


def logprob(token: str) -> TokenLogprob:
    raw = list(token.encode("utf-8"))
    return TokenLogprob(token, -0.25, raw, [TopLogprob(token, -0.25, raw), TopLogprob("x", -2.0, [120])])


def choice_deltas(
    index: int,
    pieces: Sequence[str],
    *,
    finish: str = "stop",
    batch: int = 1,
    with_logprobs: bool = False,
    reasoning: Sequence[str] = (),
) -> list[ChoiceDelta]:
    """One delta per token (reasoning pieces first), the last one carrying finish_reason + usage."""
    deltas = [ChoiceDelta(index, reasoning=piece, num_input_tokens=PROMPT_TOKENS) for piece in reasoning]
    for piece in pieces:
        lps = [logprob(piece)] if with_logprobs else None
        deltas.append(ChoiceDelta(index, text=piece, logprobs=lps, num_input_tokens=PROMPT_TOKENS))
    tokens = len(deltas)
    for i, delta in enumerate(deltas):
        delta.num_output_tokens = i + 1
    last = deltas[-1]
    last.finish_reason = finish
    last.usage = usage_for(tokens, batch=batch, reasoning=len(reasoning) if reasoning else None)
    return deltas


def interleave(*streams: list[ChoiceDelta]) -> list[ChoiceDelta]:
    """Token-by-token interleaving of several choices, as the engine emits them."""
    out: list[ChoiceDelta] = []
    for i in range(max(len(s) for s in streams)):
        out.extend(s[i] for s in streams if i < len(s))
    return out


def fixed(items: Sequence[ChoiceDelta | BackendError]) -> Script:
    """A script that answers every request with the same items."""

    def script(_req: BackendRequest) -> Sequence[ChoiceDelta | BackendError]:
        return list(items)

    return script


PIECES = ["Hello", " there", ",", " how", " can", " I", " help", "?"]


def default_script(req: BackendRequest) -> list[ChoiceDelta | BackendError]:
    """n choices of PIECES (choice k gets k fewer tokens, so lengths differ)."""
    n = int(req.parameters.get("n") or 1)
    logprobs = bool(req.parameters.get("logprobs") or req.parameters.get("top_logprobs") is not None)
    batch = n
    return list(
        interleave(
            *(choice_deltas(k, PIECES[: len(PIECES) - k], batch=batch, with_logprobs=logprobs) for k in range(n))
        )
    )


@dataclass
class FakeBackend:
    """A ChatBackend driven by a script; records requests and how their streams ended."""

    script: Script = default_script
    ready: bool = True
    delay_s: float = 0.0  # pause before each delta (lets disconnect tests catch a stream mid-way)
    pauses: dict[int, float] = field(default_factory=dict)  # extra pause before the delta at this index
    requests: list[BackendRequest] = field(default_factory=list)
    endings: list[str] = field(default_factory=list)  # "finished" | "closed" | "cancelled" | "error"
    queries: list[TokenizeQuery | DetokenizeQuery] = field(default_factory=list)  # tokenize/detokenize asked
    started: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False

    def generate(self, req: BackendRequest) -> AsyncGenerator[ChoiceDelta, None]:
        return self._generate(req)

    async def _generate(self, req: BackendRequest) -> AsyncGenerator[ChoiceDelta, None]:
        self.requests.append(req)
        self.started.set()
        ending = "finished"
        try:
            for index, item in enumerate(self.script(req)):
                if self.delay_s or index in self.pauses:
                    await asyncio.sleep(self.delay_s + self.pauses.get(index, 0.0))
                if isinstance(item, BackendError):
                    ending = "error"
                    raise item
                yield item
        except GeneratorExit:
            ending = "closed"
            raise
        except asyncio.CancelledError:
            ending = "cancelled"
            raise
        finally:
            self.endings.append(ending)
            self.ended.set()

    async def tokenize(self, query: TokenizeQuery) -> TokenizeAnswer:
        """One token per character of the prompt, or of each message's content (a stand-in tokenizer)."""
        self.queries.append(query)
        if query.messages is not None:
            text = "".join(str(m.get("content") or "") for m in query.messages)
        else:
            text = query.prompt or ""
        return TokenizeAnswer(tokens=[ord(c) for c in text], max_model_len=MAX_MODEL_LEN)

    async def detokenize(self, query: DetokenizeQuery) -> DetokenizeAnswer:
        self.queries.append(query)
        return DetokenizeAnswer(prompt="".join(chr(t) for t in query.tokens))

    async def is_ready(self) -> bool:
        return self.ready

    async def close(self) -> None:
        self.closed = True


def settings(**overrides: Any) -> FrontendSettings:
    values: dict[str, Any] = {"served_model_name": MODEL, "lora_names": ["tiny-lora"]}
    values.update(overrides)
    return FrontendSettings(**values)


def client_for(backend: FakeBackend, **overrides: Any) -> httpx.AsyncClient:
    """An httpx client talking to a fresh app in-process (no sockets)."""
    app = create_app(settings(**overrides), backend)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


def chat_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    body.update(fields)
    return body


def backend_error(
    status: int, message: str, code: str | None = None, error_type: str = "invalid_request_error"
) -> BackendError:
    return BackendError(ErrorInfo(status, message, error_type, None, code))
