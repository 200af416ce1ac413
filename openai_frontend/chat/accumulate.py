"""Per-choice aggregation of backend deltas.

Owns: ``ChoiceAccumulator`` (the whole text, reasoning, tool calls, logprobs, finish reason and
usage of one choice, built from its deltas) and the JSON form of logprobs. Used for non-streaming
bodies, for the beam-search pseudo-stream, and for cumulative text in ``fullTextEnabled`` streams.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from python_backend.protocol.contract import ChoiceDelta, ChoiceUsage, TokenLogprob
from python_backend.protocol.prompt_logprobs import PromptLogprobs, PromptPosition

# JSON has no -Infinity; vLLM reports an impossible token's logprob as this instead.
MIN_LOGPROB = -9999.0


def finite_logprob(value: float) -> float:
    return value if math.isfinite(value) else MIN_LOGPROB


def logprobs_json(items: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    content = [
        {
            "token": item.token,
            "logprob": finite_logprob(item.logprob),
            "bytes": list(item.bytes),
            "top_logprobs": [
                {"token": top.token, "logprob": finite_logprob(top.logprob), "bytes": list(top.bytes)}
                for top in item.top_logprobs
            ],
        }
        for item in items
    ]
    return {"content": content}


def _vllm_logprob(logprob: float, rank: int | None, token: str) -> dict[str, Any]:
    return {"logprob": finite_logprob(logprob), "rank": rank, "decoded_token": token}


def prompt_position_json(position: PromptPosition) -> dict[str, dict[str, Any]] | None:
    """vLLM's entry for one prompt token: ``{token id: {logprob, rank, decoded_token}}``, the
    prompt's own token first, then the top tokens; None for the first prompt token."""
    if position.logprob is None:
        return None
    entry = {str(position.token_id): _vllm_logprob(position.logprob, position.rank, position.token)}
    for top in position.top:
        entry.setdefault(str(top.token_id), _vllm_logprob(top.logprob, top.rank, top.token))
    return entry


def prompt_logprobs_json(items: PromptLogprobs) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: one entry per prompt token, null for the first."""
    return [prompt_position_json(item) for item in items]


def _merge_call(call: dict[str, Any], piece: dict[str, Any]) -> None:
    """Append a streamed tool-call fragment (OpenAI delta form) to the call it continues."""
    for key in ("id", "type"):
        if piece.get(key) and not call.get(key):
            call[key] = piece[key]
    function = piece.get("function") or {}
    target = call.setdefault("function", {})
    if function.get("name") and not target.get("name"):
        target["name"] = function["name"]
    if function.get("arguments"):
        target["arguments"] = str(target.get("arguments") or "") + str(function["arguments"])


@dataclass
class ChoiceAccumulator:
    """Everything one choice produced so far."""

    index: int
    text: str = ""
    reasoning: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    usage: ChoiceUsage | None = None
    prompt_tokens_seen: int = 0  # from ``num_input_tokens``, in case no usage arrives
    output_tokens_seen: int = 0  # from ``num_output_tokens``, same reason
    prompt_logprobs: PromptLogprobs | None = None  # the request's, on whichever choice they came with
    # Tool calls keyed by their stream ``index``; a fragment without one is a whole call.
    _calls: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, delta: ChoiceDelta) -> None:
        self.text += delta.text
        self.reasoning += delta.reasoning
        for piece in delta.tool_calls:
            key = f"i{piece['index']}" if "index" in piece else f"w{len(self._calls)}"
            if key in self._calls:
                _merge_call(self._calls[key], piece)
            else:
                self._calls[key] = {k: copy.deepcopy(v) for k, v in piece.items() if k != "index"}
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason:
            self.finish_reason = delta.finish_reason
        if delta.usage is not None:
            self.usage = delta.usage
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.prompt_tokens_seen = max(self.prompt_tokens_seen, delta.num_input_tokens)
        self.output_tokens_seen = max(self.output_tokens_seen, delta.num_output_tokens)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The complete calls, in message form (``{id, type, function: {name, arguments}}``)."""
        return list(self._calls.values())

    def final_usage(self) -> ChoiceUsage:
        """The backend's usage; token counts alone when it sent none (no timing to invent)."""
        if self.usage is not None:
            return self.usage
        return ChoiceUsage(prompt_tokens=self.prompt_tokens_seen, completion_tokens=self.output_tokens_seen)
