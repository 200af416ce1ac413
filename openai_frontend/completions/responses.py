"""Whole ``text_completion`` bodies, completions' logprobs form, and usage over several prompts.

Owns: ``LogprobsCursor`` (OpenAI's legacy ``{tokens, token_logprobs, top_logprobs,
text_offset}``, of generated tokens and, with ``echo``, of the prompt's: its first token's
log-probability and top tokens are null, as in vLLM), ``completions_usage`` and
``text_completion_body``. Usage follows chat's rules (``chat.responses``) per prompt; over several
prompts the prompt tokens add up, as vLLM counts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openai_frontend.chat.accumulate import ChoiceAccumulator, finite_logprob, prompt_logprobs_json
from openai_frontend.chat.responses import usage_fields
from python_backend.protocol.contract import ChoiceUsage, TokenLogprob
from python_backend.protocol.prompt_logprobs import PromptLogprobs, PromptPosition

OBJECT_TEXT_COMPLETION = "text_completion"


@dataclass
class LogprobsCursor:
    """Where the next token starts in its choice's text (``text_offset`` runs across chunks)."""

    offset: int = 0

    def block(self, items: list[TokenLogprob], prompt: PromptLogprobs | None = None) -> dict[str, Any]:
        """The logprobs object of ``items``, the tokens that follow the cursor, after the
        ``prompt`` tokens' when given (echo)."""
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        for position in prompt or []:
            tokens.append(position.token)
            values.append(None if position.logprob is None else finite_logprob(position.logprob))
            tops.append(_prompt_top(position))
        for item in items:
            tokens.append(item.token)
            values.append(finite_logprob(item.logprob))
            tops.append({top.token: finite_logprob(top.logprob) for top in item.top_logprobs})
        offsets = []
        for token in tokens:
            offsets.append(self.offset)
            self.offset += len(token)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _prompt_top(position: PromptPosition) -> dict[str, float] | None:
    """A prompt token's ``top_logprobs``: itself and the top tokens (vLLM's), null for the first."""
    if position.logprob is None:
        return None
    top = {position.token: finite_logprob(position.logprob)}
    for item in position.top:
        top.setdefault(item.token, finite_logprob(item.logprob))
    return top


def completions_usage(usages: dict[int, ChoiceUsage], per_prompt: int, mindie: bool) -> dict[str, Any]:
    """``usage_fields`` of all choices; prompt (and cached) tokens summed over the prompts."""
    ordered = [usages[i] for i in sorted(usages)]
    fields = usage_fields(ordered, mindie)
    prompts: dict[int, ChoiceUsage] = {}
    for index, usage in usages.items():
        group = index // per_prompt
        if group not in prompts or usage.prompt_tokens > prompts[group].prompt_tokens:
            prompts[group] = usage
    if len(prompts) > 1:
        usage_body = fields["usage"]
        usage_body["prompt_tokens"] = sum(u.prompt_tokens for u in prompts.values())
        usage_body["prompt_tokens_details"] = {"cached_tokens": sum(u.cached_tokens for u in prompts.values())}
        usage_body["total_tokens"] = usage_body["prompt_tokens"] + usage_body["completion_tokens"]
    return fields


def text_completion_body(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[ChoiceAccumulator],
    prompts: tuple[str, ...],
    echo: bool,
    logprobs: bool,
    mindie: bool,
) -> dict[str, Any]:
    """The ``text_completion`` object for finished ``choices`` (index i*n+k: prompt i)."""
    ordered = sorted(choices, key=lambda c: c.index)
    per_prompt = max(len(ordered) // len(prompts), 1)
    scored: dict[int, PromptLogprobs] = {}  # per prompt: its request's first choice carried them
    for choice in ordered:
        if choice.prompt_logprobs is not None:
            scored.setdefault(choice.index // per_prompt, choice.prompt_logprobs)
    entries = []
    for choice in ordered:
        prompt = prompts[choice.index // per_prompt] if echo else ""
        positions = scored.get(choice.index // per_prompt)
        echoed = positions if echo else None
        entry: dict[str, Any] = {
            "index": choice.index,
            "text": prompt + choice.text,
            "logprobs": None,
            "finish_reason": choice.finish_reason or "stop",
        }
        if logprobs:
            cursor = LogprobsCursor(0 if echoed is not None else len(prompt))
            entry["logprobs"] = cursor.block(choice.logprobs, echoed)
        if positions is not None:
            entry["prompt_logprobs"] = prompt_logprobs_json(positions)
        entries.append(entry)
    body: dict[str, Any] = {
        "id": request_id,
        "object": OBJECT_TEXT_COMPLETION,
        "created": created,
        "model": model,
        "choices": entries,
    }
    body.update(completions_usage({c.index: c.final_usage() for c in ordered}, per_prompt, mindie))
    return body
