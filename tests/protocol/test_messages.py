"""Chat message validation: roles, content, tool calls and the 4 MB limit."""

from __future__ import annotations

import pytest

from python_backend.protocol.errors import ContractError
from python_backend.protocol.messages import validate_messages, validate_tensor_messages


def param_of(messages) -> str | None:
    with pytest.raises(ContractError) as caught:
        validate_messages(messages)
    assert caught.value.info.status == 400
    return caught.value.info.param


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hi", "messages"),
        ([{"content": "x"}], "messages.0.role"),
        ([{"role": "user", "content": ""}], "messages.0.content"),
        ([{"role": "user"}], "messages.0.content"),
        ([{"role": "tool", "content": "42"}], "messages.0.tool_call_id"),
        ([{"role": "assistant", "content": ""}], "messages.0.content"),
        ([{"role": "user", "content": "x", "tool_calls": [CALL]}], "messages.0.tool_calls"),
        (
            [{"role": "assistant", "content": None, "tool_calls": [{**CALL, "type": "code"}]}],
            "messages.0.tool_calls.0.type",
        ),
        (
            [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{bad"}}]}],
            "messages.0.tool_calls.0.function.arguments",
        ),
        ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "messages.0.content.0.text"),
        ([{"role": "user", "content": [{"type": "sound"}]}], "messages.0.content.0.type"),
        ([{"role": "user", "content": 5}], "messages.0.content"),
        ([{"role": "user", "content": "x" * (4 * 1024 * 1024)}], "messages"),
    ],
)
def test_bad_messages_name_the_field(messages, param: str) -> None:
    assert param_of(messages) == param


def test_valid_conversations_pass() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": "x.png"}]},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "critic", "content": "custom roles go to the template"},
    ]
    assert validate_messages(messages) is messages


def test_internal_media_parts_pass_only_on_the_tensor_edge() -> None:
    internal = [{"role": "user", "content": [{"type": "image", "media_index": 0}, {"type": "text", "text": "?"}]}]
    assert validate_tensor_messages(internal) is internal
    assert param_of(internal) == "messages.0.content.0.type"  # a client may not send them
    bad_index = [{"role": "user", "content": [{"type": "audio", "media_index": "0"}]}]
    with pytest.raises(ContractError) as caught:
        validate_tensor_messages(bad_index)
    assert caught.value.info.param == "messages.0.content.0.media_index"


@pytest.mark.parametrize("messages", [[], [{"content": "x"}], [{"role": "user", "content": [{"type": "sound"}]}]])
def test_both_edges_refuse_alike(messages) -> None:
    with pytest.raises(ContractError) as tensor_edge:
        validate_tensor_messages(messages)
    with pytest.raises(ContractError) as http_edge:
        validate_messages(messages)
    assert tensor_edge.value.info == http_edge.value.info
