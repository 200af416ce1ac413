"""A request as the engine holds it, in types that import no torch.

Owns: ``EngineRequest`` (what a transport hands the engine), ``EngineEvent`` (what the engine
sends back), ``RequestGroup`` (a request as the scheduler keeps it: its rows, KV reservation,
prefill progress and finished choices) and ``rows_needed``. The scheduler works on these without
torch; what running a request on the model holds (caches, sequences, beams) is ``execution.py``'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.errors import ErrorInfo
from python_backend.protocol.params import GenerationParams
from python_backend.text.output_plan import OutputPlan

if TYPE_CHECKING:  # it imports torch, which the scheduler must not
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
    """A request as the scheduler keeps it: its reservation, prefill progress and choices ended."""

    request: EngineRequest
    max_new_tokens: int
    reservation: int
    finished: int = 0  # choices ended (sequences; beam search ends all of them at once)
    prefill_done: int = 0  # prompt tokens whose keys/values exist (cached or computed)
    prefill_started: float = 0.0

    @property
    def candidates(self) -> int:
        return rows_needed(self.request)

    @property
    def buffered(self) -> bool:
        """best_of > n: all candidates finish before the best n are sent."""
        return self.candidates > self.request.params.n
