"""One generated sequence (a choice or a best_of candidate) and the request that owns it.

Owns: per-sequence state (tokens, detokenizer, stop matcher, output pipeline, telemetry) and the
rules that end a sequence (EOS, stop token, stop string, length), plus turning its progress into
``ChoiceDelta``s. Text flows detokenizer -> stop strings -> ``OutputPipeline`` (reasoning split,
tool calls). The engine drives it; nothing here touches the model. ``EngineRequest`` and
``EngineEvent`` live in ``request.py`` and are re-exported here for the transports.
"""

from __future__ import annotations

from collections.abc import Callable

from python_backend.engine.request import EngineEvent, EngineRequest
from python_backend.protocol.contract import (
    FINISH_LENGTH,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    ChoiceDelta,
    ChoiceUsage,
    TokenLogprob,
    TopLogprob,
)
from python_backend.sampling.sampler import RowSampling, SampledToken
from python_backend.text.detokenizer import IncrementalDetokenizer
from python_backend.text.output_plan import OutputPipeline
from python_backend.text.stop_strings import StopStringMatcher

__all__ = ["EngineEvent", "EngineRequest", "Sequence", "TokenText"]


TokenText = Callable[[int], tuple[str, list[int]]]  # token id -> (text, raw bytes)


class Sequence:
    def __init__(
        self,
        index: int,
        request: EngineRequest,
        sampling: RowSampling,
        detokenizer: IncrementalDetokenizer,
        max_new_tokens: int,
        eos_ids: frozenset[int],
    ) -> None:
        self.index = index
        self.request = request
        self.sampling = sampling
        self.detokenizer = detokenizer
        self.stop = StopStringMatcher(request.params.stop, request.params.include_stop_str_in_output)
        self.max_new_tokens = max_new_tokens
        self.eos_ids = frozenset() if request.params.ignore_eos else eos_ids
        self.stop_ids = frozenset(request.params.stop_token_ids)
        self.finish_reason: str | None = None
        self.ready_at = request.arrival
        self.batch_size: list[int] = []
        self.queue_wait_us: list[int] = []
        self.decode_ms: list[float] = []
        self.prefill_ms = 0.0
        self.cumulative_logprob = 0.0
        self.output = OutputPipeline(request.output)  # holds what is produced but not yet sent
        self.pending_logprobs: list[TokenLogprob] = []
        self.sent_tokens = 0  # tokens produced when a delta was last sent (stream_interval)
        self.rope_delta = 0  # M-RoPE: next position minus prompt length after a media prompt
        self.cached_tokens = 0  # prompt tokens its prefill took from the prefix cache

    @property
    def tokens(self) -> list[int]:
        return self.sampling.output_ids

    @property
    def next_input(self) -> int:
        """The token the next decode step feeds: the last sampled one, or the prompt's last
        when the prompt came from the prefix cache and this step gives the first output."""
        tokens = self.sampling.output_ids
        return tokens[-1] if tokens else self.request.prompt_ids[-1]

    @property
    def position(self) -> int:
        """Position of the next token fed to the model (the last sampled one)."""
        return len(self.request.prompt_ids) + len(self.tokens) - 1 + self.rope_delta

    def update_suppression(self) -> None:
        """Before ``min_tokens`` is reached, EOS and stop tokens may not be sampled."""
        if len(self.tokens) < self.request.params.min_tokens:
            self.sampling.suppress_ids = tuple(self.eos_ids | self.stop_ids)
        else:
            self.sampling.suppress_ids = ()

    def record(self, started: float, ended: float, batch: int) -> None:
        """Telemetry of the step that produced this sequence's newest token."""
        self.queue_wait_us.append(max(int((started - self.ready_at) * 1e6), 0))
        self.batch_size.append(batch)
        if len(self.tokens) == 1:
            self.prefill_ms = round((ended - self.request.arrival) * 1e3, 2)
        else:
            self.decode_ms.append(round((ended - started) * 1e3, 2))
        self.ready_at = ended

    def accept(self, sampled: SampledToken, token_text: TokenText) -> None:
        """Add a sampled token and apply every rule that can end the sequence."""
        token = sampled.token_id
        self.tokens.append(token)
        self.cumulative_logprob += sampled.logprob
        if self.sampling.top_logprobs is not None:
            self.pending_logprobs.append(_logprob_entry(sampled, token_text))
        if token in self.eos_ids or (self.sampling.grammar is not None and self.sampling.grammar.terminated):
            # A finished grammar accepted a stop token: the answer is complete (even with ignore_eos).
            self._finish(FINISH_STOP)
            return
        if token in self.stop_ids:
            include = self.request.params.include_stop_str_in_output
            self._finish(FINISH_STOP, extra=token_text(token)[0] if include else "")
            return
        result = self.stop.feed(self.detokenizer.add(token))
        self.output.feed(result.text)
        if result.stopped:
            self._end(FINISH_STOP)
        elif len(self.tokens) >= self.max_new_tokens:
            self._finish(FINISH_LENGTH)

    def _finish(self, reason: str, extra: str = "") -> None:
        """End the sequence: release held text (it was not a stop string after all)."""
        tail = self.stop.feed(self.detokenizer.flush())
        text = tail.text
        if not tail.stopped:
            text += self.stop.flush() + extra
        self.output.feed(text, tokens=0)
        self._end(reason)

    def _end(self, reason: str) -> None:
        self.output.finish()
        # A normal end after at least one call is a tool-call answer; a cut by length is not.
        if reason == FINISH_STOP and self.output.call_count:
            reason = FINISH_TOOL_CALLS
        self.finish_reason = reason

    def delta_due(self, stream: bool, interval: int) -> bool:
        """Whether to send what is ready now. Always at the end; a non-streaming choice only then
        (one response per choice). A stream: until its first text has gone out (so the time to
        first token does not wait), then every ``interval`` tokens."""
        if self.finish_reason is not None:
            return True
        return stream and (self.sent_tokens == 0 or len(self.tokens) - self.sent_tokens >= interval)

    def take_delta(self, prompt_tokens: int) -> ChoiceDelta | None:
        """The delta to send now, or None when there is nothing new yet."""
        finished = self.finish_reason is not None
        text, reasoning, calls = self.output.take()
        if not (text or reasoning or calls) and not finished:
            return None
        delta = ChoiceDelta(
            index=self.index,
            text=text,
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason=self.finish_reason,
            logprobs=self.pending_logprobs if self.sampling.top_logprobs is not None else None,
            usage=self.usage(prompt_tokens) if finished else None,
            num_input_tokens=prompt_tokens,
            num_output_tokens=len(self.tokens),
            cumulative_logprob=self.cumulative_logprob,
        )
        self.pending_logprobs = []
        self.sent_tokens = len(self.tokens)
        return delta

    def usage(self, prompt_tokens: int) -> ChoiceUsage:
        return ChoiceUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=len(self.tokens),
            cached_tokens=self.cached_tokens,
            reasoning_tokens=self.output.reasoning_tokens,
            batch_size=list(self.batch_size),
            queue_wait_time=list(self.queue_wait_us),
            prefill_time=self.prefill_ms,
            decode_time_arr=list(self.decode_ms),
            cumulative_logprob=self.cumulative_logprob,
        )


def _logprob_entry(sampled: SampledToken, token_text: TokenText) -> TokenLogprob:
    text, raw = token_text(sampled.token_id)
    top = []
    for token_id, logprob in sampled.top:
        top_text, top_raw = token_text(token_id)
        top.append(TopLogprob(top_text, logprob, top_raw, token_id))
    return TokenLogprob(text, sampled.logprob, raw, top, sampled.token_id, sampled.rank)
