"""Prompt log-probabilities computed during prefill (the ``prompt_logprobs`` parameter).

Owns ``PromptScorer``: during a prefill pass that asks for them it keeps the final hidden states
that enter the model's output head (a pre-hook on the head, which then still computes only the
last position's logits, as ``logits_to_keep=1`` would), and scores the prompt tokens of the rows
that asked: the head applied to ``CHUNK_POSITIONS`` positions at a time, log_softmax in float32,
the prompt token's log-probability and rank, and the N most likely tokens. So a prompt's
[prompt_len, vocab] float32 is never held at once, only [CHUNK_POSITIONS, vocab]. The last
position is checked against the model's own logits, so a model whose logits are post-processed in
a way the scorer does not know fails the request instead of answering wrong numbers. The first
prompt token has no score (nothing precedes it); which positions a pass holds is ``prefill.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from python_backend.protocol.errors import invalid
from python_backend.protocol.prompt_logprobs import PromptCandidate, PromptPosition
from python_backend.sampling.ranks import token_ranks, top_tokens

# Positions scored per log_softmax: at a 152k vocabulary 128 x vocab float32 is 78 MB.
CHUNK_POSITIONS = 128
# The scorer's head output must match the model's own last-position logits this closely (in the
# model's dtype), or the model post-processes its logits in a way the scorer does not know.
_CHECK_TOLERANCE = 5e-2

TokenText = Callable[[int], tuple[str, list[int]]]  # token id -> (text, raw bytes)


@dataclass
class HeadInput:
    """What one pass's output head was given: [batch, positions, hidden], or None (not captured)."""

    hidden: torch.Tensor | None = None


class PromptScorer:
    """Scores prompt tokens from a pass's captured head input (see the module doc)."""

    def __init__(self, model: Any, token_text: TokenText) -> None:
        self._head = model.get_output_embeddings()
        self._config = model.config
        self._token_text = token_text

    def check_request(self, has_media: bool) -> None:
        """Refuse (400) what this model cannot score."""
        if has_media:
            raise invalid("'prompt_logprobs' is not supported for prompts with media", "prompt_logprobs")
        if self._head is None:
            raise invalid("'prompt_logprobs' is not supported by this model (no output head)", "prompt_logprobs")

    @contextmanager
    def capture(self, wanted: bool) -> Iterator[HeadInput]:
        """Within it, the next pass keeps its head input when ``wanted``; pass ``logits_to_keep=0``
        then, so that the head sees every position (it computes only the last one's logits)."""
        kept = HeadInput()
        if not wanted:
            yield kept
            return

        def keep(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            kept.hidden = args[0]
            return (args[0][:, -1:, :], *args[1:])

        handle = self._head.register_forward_pre_hook(keep)
        try:
            yield kept
        finally:
            handle.remove()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's logits for hidden states [..., hidden], with the known post-head scalings."""
        logits = self._head(hidden)
        config = self._config
        softcap = getattr(config, "final_logit_softcapping", None)
        if softcap:  # Gemma 2 / 3
            logits = torch.tanh(logits / softcap) * softcap
        scale = getattr(config, "logit_scale", None)
        if isinstance(scale, (int, float)) and scale != 1:  # Cohere
            logits = logits * scale
        scaling = getattr(config, "logits_scaling", None)
        if isinstance(scaling, (int, float)) and scaling != 1:  # Granite
            logits = logits / scaling
        return logits

    def check_last(self, hidden: torch.Tensor, model_logits: torch.Tensor) -> None:
        """Raise when the scorer's logits of a row's last position differ from the model's own."""
        ours = self.logits(hidden[-1:]).float()
        if not torch.allclose(
            ours, model_logits.float().reshape(ours.shape), atol=_CHECK_TOLERANCE, rtol=_CHECK_TOLERANCE
        ):
            raise RuntimeError("prompt log-probabilities disagree with the model's logits; not scored")

    def score(self, hidden: torch.Tensor, targets: list[int], top_n: int) -> list[PromptPosition]:
        """``targets[i]`` scored from ``hidden[i]`` ([positions, hidden] of one row), in chunks."""
        scored: list[PromptPosition] = []
        for start in range(0, len(targets), CHUNK_POSITIONS):
            ids = targets[start : start + CHUNK_POSITIONS]
            logprobs = torch.log_softmax(self.logits(hidden[start : start + len(ids)]).float(), dim=-1)
            targets_here = torch.tensor(ids, device=logprobs.device)
            chosen = logprobs.gather(1, targets_here.unsqueeze(1))
            ranks = token_ranks(logprobs, targets_here)  # ties ranked as the top list orders them
            top_values: list[list[float]] = [[] for _ in ids]
            top_ids: list[list[int]] = [[] for _ in ids]
            if top_n:
                top_ids, top_values = top_tokens(logprobs, top_n)
            own = chosen.squeeze(1).tolist()  # one device-to-host copy per chunk, not per position
            for i, token_id in enumerate(ids):
                top = tuple(
                    PromptCandidate(t, v, rank, self._token_text(t)[0])
                    for rank, (t, v) in enumerate(zip(top_ids[i], top_values[i], strict=True), start=1)
                )
                text = self._token_text(token_id)[0]
                scored.append(PromptPosition(token_id, text, own[i], ranks[i], top))
        return scored

    def first(self, token_id: int) -> PromptPosition:
        """The prompt's first token: nothing precedes it, so it has no score."""
        return PromptPosition(token_id, self._token_text(token_id)[0])
