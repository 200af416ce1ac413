"""The wire form of a response channel: the deltas of many requests in one response.

Owns ``ChannelEntry`` and ``encode_entries`` / ``decode_entries``, the JSON list that a channel's
``channel_deltas`` output carries (contract.py names the tensors). One entry is one request's
delta, or just its end; fields that say nothing are left out, as absent tensors are in a
per-request response. numpy- and torch-free, so both sides use it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from python_backend.protocol.contract import ChoiceDelta, ChoiceUsage, logprob_wire, said, token_logprob
from python_backend.protocol.prompt_logprobs import prompt_logprobs_wire, read_prompt_logprobs


@dataclass(frozen=True)
class ChannelEntry:
    """One request's share of a channel response."""

    request_id: str
    delta: ChoiceDelta | None  # None: no text, only the end of the request
    last: bool = False  # the request's last event: its own stream then ends with the final flag


# How the fields that are not plain JSON values are written.
_WIRE_FORMS: dict[str, Callable[[Any], Any]] = {
    "logprobs": lambda items: [logprob_wire(lp) for lp in items],
    "usage": asdict,
    "prompt_logprobs": prompt_logprobs_wire,
}


def _delta_fields(delta: ChoiceDelta) -> dict[str, Any]:
    # text always (an entry with a delta is one with text, even empty); cumulative_logprob never:
    # a channel's requests speak our contract, which has it in usage.
    fields: dict[str, Any] = {"text": delta.text}
    for name, value in said(delta).items():
        if name != "cumulative_logprob":
            fields[name] = _WIRE_FORMS[name](value) if name in _WIRE_FORMS else value
    return fields


def _delta(fields: dict[str, Any]) -> ChoiceDelta:
    logprobs = fields.get("logprobs")
    usage = fields.get("usage")
    prompt = fields.get("prompt_logprobs")
    return ChoiceDelta(
        index=int(fields.get("index", 0)),
        text=str(fields.get("text", "")),
        reasoning=str(fields.get("reasoning", "")),
        tool_calls=list(fields.get("tool_calls", [])),
        finish_reason=fields.get("finish_reason") or None,
        logprobs=[token_logprob(lp) for lp in logprobs] if logprobs is not None else None,
        usage=ChoiceUsage(**usage) if usage is not None else None,
        num_input_tokens=int(fields.get("num_input_tokens", 0)),
        num_output_tokens=int(fields.get("num_output_tokens", 0)),
        prompt_logprobs=read_prompt_logprobs(prompt) if prompt is not None else None,
    )


def encode_entries(entries: list[ChannelEntry]) -> str:
    """The ``channel_deltas`` text of one channel response."""
    wire = []
    for entry in entries:
        item: dict[str, Any] = {"id": entry.request_id}
        if entry.delta is not None:
            item["delta"] = _delta_fields(entry.delta)
        if entry.last:
            item["last"] = True
        wire.append(item)
    return json.dumps(wire, ensure_ascii=False)


def decode_entries(text: str) -> list[ChannelEntry]:
    """The entries of one ``channel_deltas`` text; ``ValueError`` when it is not one."""
    try:
        wire = json.loads(text)
        return [
            ChannelEntry(
                request_id=str(item["id"]),
                delta=_delta(item["delta"]) if "delta" in item else None,
                last=bool(item.get("last", False)),
            )
            for item in wire
        ]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a channel_deltas list: {exc}") from exc
