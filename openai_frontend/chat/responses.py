"""Whole-response bodies and usage objects (non-streaming answers and the beam-search pseudo-stream).

Owns: ``completion_body`` (the ``chat.completion`` object in MindIE or plain OpenAI form),
``choice_usage`` (one choice's usage, as MindIE's final stream chunks carry it),
``total_usage`` (all choices together) and ``usage_fields`` (that, with MindIE's timings). The rules (docs/api.md, usage):
``completion_tokens`` is the sum over choices, ``batch_size``/``queue_wait_time`` and
``decode_time_arr`` come from the longest choice, ``prefill_time`` is the largest of the choices',
``prompt_tokens_details`` is always present, ``completion_tokens_details`` only when the backend
reports reasoning tokens.
"""

from __future__ import annotations

from typing import Any

from openai_frontend.chat.accumulate import ChoiceAccumulator, logprobs_json, prompt_logprobs_json
from python_backend.protocol.contract import ChoiceUsage

OBJECT_COMPLETION = "chat.completion"


def _details(usages: list[ChoiceUsage]) -> dict[str, Any] | None:
    reported = [u.reasoning_tokens for u in usages if u.reasoning_tokens is not None]
    return {"reasoning_tokens": sum(reported)} if reported else None


def choice_usage(usage: ChoiceUsage) -> dict[str, Any]:
    """MindIE usage of one choice (a stream's final chunk for that choice)."""
    body: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens": usage.completion_tokens,
    }
    details = _details([usage])
    if details is not None:
        body["completion_tokens_details"] = details
    body["total_tokens"] = usage.prompt_tokens + usage.completion_tokens
    body["batch_size"] = list(usage.batch_size)
    body["queue_wait_time"] = list(usage.queue_wait_time)
    return body


def longest(usages: list[ChoiceUsage]) -> ChoiceUsage:
    """The choice with the most tokens: its per-token arrays describe the whole request."""
    return max(usages, key=lambda u: u.completion_tokens)


def total_usage(usages: list[ChoiceUsage], mindie: bool) -> dict[str, Any]:
    """Usage of a whole request; MindIE mode adds the per-token arrays of the longest choice."""
    if not usages:
        usages = [ChoiceUsage(prompt_tokens=0, completion_tokens=0)]
    prompt = max(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    cached = max(u.cached_tokens for u in usages)
    details = _details(usages)
    if not mindie:
        body: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if details is not None:
            body["completion_tokens_details"] = details
        return body
    body = {
        "prompt_tokens": prompt,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens": completion,
    }
    if details is not None:
        body["completion_tokens_details"] = details
    top = longest(usages)
    body["total_tokens"] = prompt + completion
    body["batch_size"] = list(top.batch_size)
    body["queue_wait_time"] = list(top.queue_wait_time)
    return body


def _message(choice: ChoiceAccumulator, mindie: bool) -> dict[str, Any]:
    calls = choice.tool_calls
    content: str | None = choice.text
    if not mindie and calls and not choice.text:
        content = None  # OpenAI: a pure tool-call answer has null content
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if choice.reasoning:
        message["reasoning_content"] = choice.reasoning
    if mindie or calls:
        message["tool_calls"] = calls  # MindIE always lists them ([] when none)
    return message


def completion_body(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[ChoiceAccumulator],
    logprobs: bool,
    mindie: bool,
) -> dict[str, Any]:
    """The ``chat.completion`` object for finished ``choices``."""
    ordered = sorted(choices, key=lambda c: c.index)
    body: dict[str, Any] = {
        "id": request_id,
        "object": OBJECT_COMPLETION,
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "message": _message(c, mindie),
                "logprobs": logprobs_json(c.logprobs) if logprobs else None,
                "finish_reason": c.finish_reason or "stop",
            }
            for c in ordered
        ],
    }
    body.update(usage_fields([c.final_usage() for c in ordered], mindie))
    scored = next((c.prompt_logprobs for c in ordered if c.prompt_logprobs is not None), None)
    if scored is not None:  # vLLM's place for them: the response, not a choice
        body["prompt_logprobs"] = prompt_logprobs_json(scored)
    return body


def usage_fields(usages: list[ChoiceUsage], mindie: bool) -> dict[str, Any]:
    """A whole answer's ``usage``, and in MindIE mode its ``prefill_time`` and ``decode_time_arr``."""
    fields: dict[str, Any] = {"usage": total_usage(usages, mindie)}
    if mindie:
        fields["prefill_time"] = max((u.prefill_time for u in usages), default=0.0)
        fields["decode_time_arr"] = list(longest(usages).decode_time_arr) if usages else []
    return fields
