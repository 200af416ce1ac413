"""A request as the engine holds it, in types that import no torch.

Owns: ``EngineRequest`` (what a transport hands the engine), ``EngineEvent`` (what the engine
sends back), ``RequestGroup`` (a request inside the engine: its rows, reservation, prefill
progress and, once running, its sequences) and ``rows_needed``. The scheduler works on these
without torch; the execution-side fields are typed only for the checker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.errors import ErrorInfo
from python_backend.protocol.params import GenerationParams
from python_backend.protocol.prompt_logprobs import PromptLogprobs
from python_backend.text.output_plan import OutputPlan

if TYPE_CHECKING:  # execution-side types: they import torch, which the scheduler must not
    from python_backend.engine.batch_cache import BatchCache
    from python_backend.engine.beam_search import BeamSearch
    from python_backend.engine.prefix_cache import PrefixHit
    from python_backend.engine.sequence import Sequence
    from python_backend.prompt.multimodal.processor import MediaInputs


@dataclass
class EngineEvent:
    """What the engine tells a request's sink: a delta, an error, or just the end."""

    request_id: str
    delta: ChoiceDelta | None = None
    error: ErrorInfo | None = None
    final: bool = False  # the request's last event


@dataclass
class EngineRequest:
    """A validated, tokenized request handed to the engine."""

    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    sink: Callable[[EngineEvent], None]
    is_cancelled: Callable[[], bool] = lambda: False
    stream: bool = True
    arrival: float = field(default_factory=time.perf_counter)
    output: OutputPlan = field(default_factory=OutputPlan)  # reasoning / tool-call parsing
    grammar: Any = None  # compiled response_format grammar (structured.GrammarCompiler.compile)
    media: MediaInputs | None = None  # a media request's extra prefill inputs, dropped after prefill


def rows_needed(request: EngineRequest) -> int:
    """Batch rows a request occupies: its beams, or its n / best_of sampled sequences."""
    params = request.params
    return params.n if params.use_beam_search else params.candidates


@dataclass(eq=False)  # identity semantics: groups are compared with `is`, never by value
class RequestGroup:
    """A request in the engine: its sequences (n or best_of of them) and its bookkeeping."""

    request: EngineRequest
    max_new_tokens: int
    reservation: int
    sequences: list[Sequence] = field(default_factory=list)
    finished: int = 0
    prefill_done: int = 0  # prompt tokens whose keys/values exist (cached or computed)
    prefill_cache: BatchCache | None = None
    prefill_started: float = 0.0
    beam: BeamSearch | None = None
    prefill_ms: float = 0.0
    prefix_hit: PrefixHit | None = None  # cached keys/values its chunked prefill starts from
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache (usage.cached_tokens)
    prompt_logprobs: PromptLogprobs | None = None  # scored in prefill, until the first delta takes them

    @property
    def candidates(self) -> int:
        return rows_needed(self.request)

    def attach_prompt_logprobs(self, delta: ChoiceDelta | None) -> None:
        """The request's first delta carries its prompt log-probabilities, and only that one."""
        if delta is not None and self.prompt_logprobs is not None:
            delta.prompt_logprobs, self.prompt_logprobs = self.prompt_logprobs, None

    @property
    def buffered(self) -> bool:
        """best_of > n: all candidates finish before the best n are sent."""
        return self.candidates > self.request.params.n
