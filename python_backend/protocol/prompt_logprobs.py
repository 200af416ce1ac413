"""Prompt log-probabilities: what the ``prompt_logprobs`` output tensor carries.

Owns ``PromptCandidate`` (a likely token at one prompt position: its id, log-probability, rank
and text), ``PromptPosition`` (one prompt token: its id and text, its log-probability and rank
given the tokens before it, and the N most likely tokens there) and their JSON
(``prompt_logprobs_wire`` / ``read_prompt_logprobs``): a list with one object per prompt token.
The first token has no log-probability (nothing precedes it), so its object has only ``id`` and
``token``. numpy- and torch-free, so both sides use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from python_backend.protocol.errors import invalid


@dataclass(frozen=True)
class PromptCandidate:
    token_id: int
    logprob: float
    rank: int  # 1 + how many vocabulary entries are more likely at this position
    token: str  # the token's own text (vLLM's ``decoded_token``)


@dataclass(frozen=True)
class PromptPosition:
    """One prompt token, scored given the tokens before it."""

    token_id: int
    token: str
    logprob: float | None = None  # None for the first prompt token, which nothing precedes
    rank: int | None = None
    top: tuple[PromptCandidate, ...] = ()  # the ``prompt_logprobs`` most likely, most likely first


PromptLogprobs = list[PromptPosition]  # one per prompt token


def _candidate_wire(item: PromptCandidate) -> dict[str, Any]:
    return {"id": item.token_id, "logprob": item.logprob, "rank": item.rank, "token": item.token}


def _candidate(raw: dict[str, Any]) -> PromptCandidate:
    return PromptCandidate(int(raw["id"]), float(raw["logprob"]), int(raw["rank"]), str(raw["token"]))


def _position_wire(item: PromptPosition) -> dict[str, Any]:
    if item.logprob is None:
        return {"id": item.token_id, "token": item.token}
    return {
        "id": item.token_id,
        "token": item.token,
        "logprob": item.logprob,
        "rank": item.rank,
        "top": [_candidate_wire(c) for c in item.top],
    }


def _position(raw: dict[str, Any]) -> PromptPosition:
    if raw.get("logprob") is None:
        return PromptPosition(int(raw["id"]), str(raw["token"]))
    top = tuple(_candidate(c) for c in raw.get("top", []))
    return PromptPosition(int(raw["id"]), str(raw["token"]), float(raw["logprob"]), int(raw["rank"]), top)


def prompt_logprobs_wire(items: PromptLogprobs) -> list[dict[str, Any]]:
    """The JSON list of ``items``."""
    return [_position_wire(item) for item in items]


def read_prompt_logprobs(raw: Any) -> PromptLogprobs:
    """``PromptLogprobs`` from their JSON list; a 400 naming the tensor when it is not one."""
    try:
        return [_position(item) for item in raw]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise invalid(f"'prompt_logprobs' is not a list of prompt positions: {exc}", "prompt_logprobs") from exc
