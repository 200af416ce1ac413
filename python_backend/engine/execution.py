"""A request's execution state: what running it on the model holds, apart from its scheduling.

Owns ``Execution`` (a request's prefill cache, prefix-cache hit and cached-token count, the
prompt log-probabilities scored in its prefill, its sequences and its beams) and ``Executions``
(the step runner's map from each request on the scheduler's books to its execution state, as
vLLM's model runner keeps its requests' cached state beside the scheduler's). The scheduling side
(``request.py``'s ``RequestGroup``: reservation, rows, prefill progress, finished choices) knows
nothing of this, so it imports no torch. The engine thread alone uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from python_backend.engine.batch_cache import BatchCache
from python_backend.engine.beam_search import BeamSearch
from python_backend.engine.prefix_cache import PrefixHit
from python_backend.engine.request import EngineRequest, RequestGroup
from python_backend.engine.sequence import Sequence
from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.prompt_logprobs import PromptLogprobs


@dataclass(eq=False)  # identity semantics, as its group's
class Execution:
    """One request's state on the model, from its first prefill pass to its last token."""

    group: RequestGroup  # its scheduling side
    sequences: list[Sequence] = field(default_factory=list)  # once running: n, best_of or beam-width
    prefill_cache: BatchCache | None = None  # a long prompt's cache between its chunks
    beam: BeamSearch | None = None
    prefill_ms: float = 0.0
    prefix_hit: PrefixHit | None = None  # cached keys/values its prefill starts from
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache (usage.cached_tokens)
    prompt_logprobs: PromptLogprobs | None = None  # scored in prefill, until the first delta takes them

    @property
    def request(self) -> EngineRequest:
        return self.group.request

    @property
    def candidates(self) -> int:
        return self.group.candidates

    def attach_prompt_logprobs(self, delta: ChoiceDelta | None) -> None:
        """The request's first delta carries its prompt log-probabilities, and only that one."""
        if delta is not None and self.prompt_logprobs is not None:
            delta.prompt_logprobs, self.prompt_logprobs = self.prompt_logprobs, None


class Executions:
    """Each request's ``Execution`` by request id, made when first asked for."""

    def __init__(self) -> None:
        self._by_id: dict[str, Execution] = {}

    def of(self, group: RequestGroup) -> Execution:
        run = self._by_id.get(group.request.request_id)
        if run is None or run.group is not group:  # ids may repeat once a request has left
            run = self._by_id[group.request.request_id] = Execution(group)
        return run

    def get(self, group: RequestGroup) -> Execution | None:
        run = self._by_id.get(group.request.request_id)
        return run if run is not None and run.group is group else None

    def forget(self, group: RequestGroup) -> None:
        run = self._by_id.get(group.request.request_id)
        if run is not None and run.group is group:
            del self._by_id[group.request.request_id]

    def retain(self, on_books: Callable[[str], RequestGroup | None]) -> None:
        """Forget the state of every request that is no longer on the scheduler's books."""
        gone = [rid for rid, run in self._by_id.items() if on_books(rid) is not run.group]
        for request_id in gone:
            del self._by_id[request_id]
