"""The wire form of a response channel: the deltas of many requests in one response.

Owns ``ChannelEntry`` and ``encode_entries`` / ``decode_entries``, the JSON list that a channel's
``channel_deltas`` output carries (contract.py names the tensors). One entry is one request's
delta, or just its end; fields that say nothing are left out, as absent tensors are in a
per-request response. numpy- and torch-free, so both sides use it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from python_backend.protocol.contract import ChoiceDelta, ChoiceUsage, logprob_wire, token_logprob
from python_backend.protocol.prompt_logprobs import prompt_logprobs_wire, read_prompt_logprobs


@dataclass(frozen=True)
class ChannelEntry:
    """One request's share of a channel response."""

    request_id: str
    delta: ChoiceDelta | None  # None: no text, only the end of the request
    last: bool = False  # the request's last event: its own stream then ends with the final flag


def _delta_fields(delta: ChoiceDelta) -> dict[str, Any]:
    fields: dict[str, Any] = {"text": delta.text}
    if delta.index:
        fields["index"] = delta.index
    if delta.reasoning:
        fields["reasoning"] = delta.reasoning
    if delta.tool_calls:
        fields["tool_calls"] = delta.tool_calls
    if delta.finish_reason:
        fields["finish_reason"] = delta.finish_reason
    if delta.logprobs is not None:
        fields["logprobs"] = [logprob_wire(lp) for lp in delta.logprobs]
    if delta.usage is not None:
        fields["usage"] = asdict(delta.usage)
    if delta.num_input_tokens:
        fields["num_input_tokens"] = delta.num_input_tokens
    if delta.num_output_tokens:
        fields["num_output_tokens"] = delta.num_output_tokens
    if delta.prompt_logprobs is not None:
        fields["prompt_logprobs"] = prompt_logprobs_wire(delta.prompt_logprobs)
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
