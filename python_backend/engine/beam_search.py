"""Beam search for one request: ``n`` beams that live as ``n`` rows of the running batch.

Owns: ``BeamSearch``, which takes each step's logits for its rows and says which parent row each
beam continues and with which token, keeps finished hypotheses, and decides when the search is
over. The engine applies the parent mapping to the KV rows (``KVBatch.copy_rows``); nothing here
touches the model. Scores are sums of token log-probabilities; hypotheses are ranked by score
divided by length (length penalty 1.0, as in transformers and vLLM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from python_backend.protocol.contract import FINISH_LENGTH, FINISH_STOP, ChoiceDelta, ChoiceUsage


@dataclass
class Hypothesis:
    tokens: list[int]
    score: float  # sum of log-probabilities
    finished_by_eos: bool
    batch_size: list[int] = field(default_factory=list)
    queue_wait_us: list[int] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)

    @property
    def ranking(self) -> float:
        return self.score / max(len(self.tokens), 1)


@dataclass
class BeamStep:
    parents: list[int]  # for each beam, the beam (row within the group) it continues
    tokens: list[int]  # the token each beam appends


class BeamSearch:
    def __init__(self, width: int, max_new_tokens: int, eos_ids: frozenset[int]) -> None:
        self.width = width
        self.max_new_tokens = max_new_tokens
        self.eos_ids = eos_ids
        self.beams: list[Hypothesis] = [Hypothesis([], 0.0, False) for _ in range(width)]
        self.finished: list[Hypothesis] = []
        self.first_step = True

    def step(self, logits: torch.Tensor, waits_us: list[int], batch: int, decode_ms: float | None) -> BeamStep:
        """Advance every beam by one token; ``logits`` is [width, vocab] (one row per beam).

        ``waits_us`` (per beam row), ``batch`` and ``decode_ms`` are the telemetry of this step,
        recorded on every hypothesis it grows (a beam inherits its parent's history).
        """
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if self.first_step:
            # All beams hold the same prefix: expand only the first, or they would all pick alike.
            logprobs = logprobs[:1]
            self.first_step = False
        scores = torch.tensor([b.score for b in self.beams[: logprobs.shape[0]]], device=logprobs.device)
        total = (logprobs + scores.unsqueeze(1)).reshape(-1)
        vocab = logprobs.shape[1]
        # 2 x width candidates always leave `width` that do not end (at most width end with EOS).
        values, flat = torch.topk(total, min(2 * self.width, total.numel()))
        parents: list[int] = []
        tokens: list[int] = []
        survivors: list[Hypothesis] = []
        for value, index in zip(values.tolist(), flat.tolist(), strict=True):
            parent, token = divmod(index, vocab)
            source = self.beams[parent]
            grown = Hypothesis(
                source.tokens + [token], value, token in self.eos_ids,
                source.batch_size + [batch], source.queue_wait_us + [waits_us[parent]],
                source.decode_ms + ([decode_ms] if decode_ms is not None else []),
            )  # fmt: skip
            if grown.finished_by_eos:
                if len(self.finished) < self.width or grown.ranking > min(h.ranking for h in self.finished):
                    self.finished.append(grown)
                continue
            survivors.append(grown)
            parents.append(parent)
            tokens.append(token)
            if len(survivors) == self.width:
                break
        self.beams = survivors
        self.finished = sorted(self.finished, key=lambda h: h.ranking, reverse=True)[: self.width]
        return BeamStep(parents, tokens)

    @property
    def done(self) -> bool:
        if not self.beams or len(self.beams[0].tokens) >= self.max_new_tokens:
            return True
        # Early stop (transformers' early_stopping=True): `width` finished hypotheses exist and
        # no running beam ranks above the worst of them.
        if len(self.finished) < self.width:
            return False
        worst = min(h.ranking for h in self.finished)
        return all(b.ranking <= worst for b in self.beams)

    def best(self, n: int) -> list[Hypothesis]:
        pool = self.finished + self.beams
        return sorted(pool, key=lambda h: h.ranking, reverse=True)[:n]

    def answers(
        self, n: int, prompt_tokens: int, prefill_ms: float, decode: Callable[[list[int]], str]
    ) -> list[ChoiceDelta]:
        """The best ``n`` hypotheses as whole choices, indexed from 0, each with its usage."""
        deltas = []
        for index, hypothesis in enumerate(self.best(n)):
            tokens = hypothesis.tokens[:-1] if hypothesis.finished_by_eos else hypothesis.tokens
            usage = ChoiceUsage(
                prompt_tokens=prompt_tokens,
                completion_tokens=len(hypothesis.tokens),
                batch_size=hypothesis.batch_size,
                queue_wait_time=hypothesis.queue_wait_us,
                prefill_time=prefill_ms,
                decode_time_arr=hypothesis.decode_ms,
                cumulative_logprob=hypothesis.score,
            )
            deltas.append(
                ChoiceDelta(
                    index=index,
                    text=decode(tokens),
                    finish_reason=FINISH_STOP if hypothesis.finished_by_eos else FINISH_LENGTH,
                    usage=usage,
                    num_input_tokens=prompt_tokens,
                    num_output_tokens=len(hypothesis.tokens),
                )
            )
        return deltas
