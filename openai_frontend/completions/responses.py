"""Whole ``text_completion`` bodies, completions' logprobs form, and usage over several prompts.

Owns: ``LogprobsCursor`` (OpenAI's legacy ``{tokens, token_logprobs, top_logprobs,
text_offset}``), ``completions_usage`` and ``text_completion_body``. Usage follows chat's rules
(``chat.responses``) per prompt; over several prompts the prompt tokens add up, as vLLM counts
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openai_frontend.chat.accumulate import ChoiceAccumulator, finite_logprob
from openai_frontend.chat.responses import usage_fields
from python_backend.protocol.contract import ChoiceUsage, TokenLogprob

OBJECT_TEXT_COMPLETION = "text_completion"


@dataclass
class LogprobsCursor:
    """Where the next token starts in its choice's text (``text_offset`` runs across chunks)."""

    offset: int = 0

    def block(self, items: list[TokenLogprob]) -> dict[str, Any]:
        """The logprobs object of ``items``, the tokens that follow the cursor."""
        offsets = []
        for item in items:
            offsets.append(self.offset)
            self.offset += len(item.token)
        return {
            "tokens": [item.token for item in items],
            "token_logprobs": [finite_logprob(item.logprob) for item in items],
            "top_logprobs": [{top.token: finite_logprob(top.logprob) for top in item.top_logprobs} for item in items],
            "text_offset": offsets,
        }


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
    entries = []
    for choice in ordered:
        prompt = prompts[choice.index // per_prompt] if echo else ""
        entries.append(
            {
                "index": choice.index,
                "text": prompt + choice.text,
                "logprobs": LogprobsCursor(len(prompt)).block(choice.logprobs) if logprobs else None,
                "finish_reason": choice.finish_reason or "stop",
            }
        )
    body: dict[str, Any] = {
        "id": request_id,
        "object": OBJECT_TEXT_COMPLETION,
        "created": created,
        "model": model,
        "choices": entries,
    }
    body.update(completions_usage({c.index: c.final_usage() for c in ordered}, per_prompt, mindie))
    return body
