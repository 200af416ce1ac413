"""Keeping the ranks' engines in step: the engine's ``StepSync`` for rank 0 and for the others.

Owns ``LeaderSync`` (rank 0: after each step's reap it tells the other ranks which requests
arrived and which were cancelled; after each sampling, the tokens) and ``FollowerSync`` (the
other ranks: they replay both), with the messages between them. Every rank then makes the same
scheduling decisions and the same key/value-cache moves, and runs the same forward passes on its
shard. A follower's requests are copies without a transport: their events go nowhere, and the
grammar of a ``response_format`` request follows the leader's tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from python_backend.engine.admission import Admission
from python_backend.engine.limits import Limits
from python_backend.engine.request import EngineEvent, EngineRequest, RequestGroup
from python_backend.intake.intake import Connection, Intake
from python_backend.model.loader import LoadedModel
from python_backend.parallel.group import Channel
from python_backend.prompt.inputs import PreparedRequest
from python_backend.protocol.params import GenerationParams
from python_backend.sampling.sampler import RowSampling, SampledToken, sample
from python_backend.sampling.structured import GrammarCompiler
from python_backend.text.output_plan import OutputPlan

logger = logging.getLogger(__name__)


class OutOfStep(RuntimeError):
    """A follower got a message it did not expect: the ranks no longer run the same steps."""


@dataclass(frozen=True)
class Arrival:
    """A request as the followers need it: everything that decides its rows and its end."""

    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    stream: bool
    output: OutputPlan
    max_new_tokens: int
    reservation: int


@dataclass(frozen=True)
class StepMessage:
    arrivals: list[Arrival] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    stop: bool = False  # the leader's engine stopped: end the loop


@dataclass(frozen=True)
class SampleMessage:
    tokens: list[SampledToken]


class RecordingAdmission(Admission):
    """Rank 0's admission: it also keeps what each step took in, for the other ranks."""

    def __init__(self, max_waiting: int, kv_budget_tokens: int) -> None:
        super().__init__(max_waiting, kv_budget_tokens)
        self._arrived: list[RequestGroup] = []
        self._cancelled: list[str] = []

    def drain(self) -> list[RequestGroup]:
        arrived = super().drain()
        self._arrived += arrived
        return arrived

    def take_cancelled(self) -> set[str]:
        cancelled = super().take_cancelled()
        self._cancelled += sorted(cancelled)
        return cancelled

    def take_record(self) -> StepMessage:
        """What was taken in since the last call."""
        arrivals = [_arrival(g) for g in self._arrived]
        message = StepMessage(arrivals, self._cancelled)
        self._arrived, self._cancelled = [], []
        return message


def _arrival(group: RequestGroup) -> Arrival:
    request = group.request
    return Arrival(
        request.request_id,
        request.prompt_ids,
        request.params,
        request.stream,
        request.output,
        group.max_new_tokens,
        group.reservation,
    )


def _smallest(limits: list[Limits]) -> Limits:
    # Budgets are per rank (a rank's own memory); all ranks must admit the same requests.
    return dataclasses.replace(
        limits[0],
        kv_budget_tokens=min(limit.kv_budget_tokens for limit in limits),
        prefix_cache_tokens=min(limit.prefix_cache_tokens for limit in limits),
    )


def _agree(channel: Channel, limits: Limits) -> Limits:
    gathered = channel.gather(limits)
    agreed = _smallest([g for g in gathered if isinstance(g, Limits)])
    logger.info(
        "tensor parallel: KV budget %d tokens per rank (%.1f MiB per rank, %d bytes per token per rank)",
        agreed.kv_budget_tokens,
        agreed.kv_budget_tokens * agreed.kv_bytes_per_token / (1 << 20),
        agreed.kv_bytes_per_token,
    )
    return agreed


class LeaderSync:
    """Rank 0's side of ``StepSync``."""

    leads = True

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._admission: RecordingAdmission | None = None

    def admission(self, max_waiting: int, kv_budget_tokens: int) -> Admission:
        self._admission = RecordingAdmission(max_waiting, kv_budget_tokens)
        return self._admission

    def agree(self, limits: Limits) -> Limits:
        return _agree(self._channel, limits)

    def step(self, reap: Callable[[], None]) -> bool:
        if self._admission is None:
            raise RuntimeError("the engine made no admission through this group")
        reap()
        self._channel.send(self._admission.take_record())
        return True

    def sample(self, logits: torch.Tensor, rows: list[RowSampling]) -> list[SampledToken]:
        tokens = sample(logits, rows)
        self._channel.send(SampleMessage(tokens))
        return tokens

    def stop(self) -> None:
        """Tell the other ranks to end their loops (after rank 0's engine has stopped)."""
        self._channel.send(StepMessage(stop=True))


def _discard(_event: EngineEvent) -> None:
    """A follower's events: the leader answers the request."""


class FollowerSync:
    """The other ranks' side of ``StepSync``."""

    leads = False

    def __init__(self, channel: Channel, loaded: LoadedModel) -> None:
        self._channel = channel
        # The leader prepared each request: a follower's intake only builds it, grammar included.
        self._intake = Intake(loaded.tokenizer, GrammarCompiler(loaded.tokenizer, loaded.vocab_size))
        self._admission: Admission | None = None
        self.stopped = threading.Event()  # the leader said stop

    def admission(self, max_waiting: int, kv_budget_tokens: int) -> Admission:
        self._admission = Admission(max_waiting, kv_budget_tokens)
        return self._admission

    def agree(self, limits: Limits) -> Limits:
        return _agree(self._channel, limits)

    def step(self, reap: Callable[[], None]) -> bool:
        admission = self._admission
        if admission is None:
            raise RuntimeError("the engine made no admission through this group")
        message = self._channel.receive()
        if not isinstance(message, StepMessage):
            raise OutOfStep(f"expected a step, got {type(message).__name__}")
        if message.stop:
            self.stopped.set()
            return False
        for arrival in message.arrivals:
            admission.enqueue(RequestGroup(self._request(arrival), arrival.max_new_tokens, arrival.reservation))
        for request_id in message.cancelled:
            admission.request_cancel(request_id)
        reap()
        return True

    def sample(self, logits: torch.Tensor, rows: list[RowSampling]) -> list[SampledToken]:
        message = self._channel.receive()
        if not isinstance(message, SampleMessage) or len(message.tokens) != len(rows):
            raise OutOfStep(f"expected {len(rows)} sampled tokens, got {message!r:.200}")
        for token, row in zip(message.tokens, rows, strict=True):
            if row.grammar is not None:
                row.grammar.accept(token.token_id)
        return message.tokens

    def _request(self, arrival: Arrival) -> EngineRequest:
        prepared = PreparedRequest(arrival.prompt_ids, arrival.params, arrival.stream, "", arrival.output)
        grammar = self._intake.grammar_now(arrival.params)
        return self._intake.request(arrival.request_id, prepared, grammar, Connection(_discard))
