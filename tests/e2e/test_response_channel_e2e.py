"""Response channels through the real tritonserver, as a plain tritonclient user would use them.

A channel (``open_channel``) carries the deltas of every request that names it (``stream_channel``),
one response per engine pass; each request's own stream carries only its end or its error;
``cancel_request`` cancels a request or closes a channel. The frontend uses all three (it is
on by default, so every frontend e2e test streams through a channel); here the contract itself.
"""

from __future__ import annotations

import json
import queue
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry, decode_entries
from python_backend.protocol.errors import ErrorInfo
from tests.e2e.conftest import TritonHandle
from tests.e2e.test_chat_e2e import wait_for_gauge

Responses = queue.Queue[tuple[Any, Any]]


def _tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    spec = next(s for s in contract.INPUT_SPECS if s.name == name)
    tensor = grpcclient.InferInput(name, list(array.shape), spec.datatype)
    tensor.set_data_from_numpy(array)
    return tensor


@contextmanager
def _stream(handle: TritonHandle) -> Iterator[tuple[grpcclient.InferenceServerClient, Responses]]:
    responses: Responses = queue.Queue()
    client = grpcclient.InferenceServerClient(handle.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        yield client, responses
    finally:
        client.stop_stream()
        client.close()


def _is_final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _chat(prompt: str, max_tokens: int, channel: str | None) -> list[grpcclient.InferInput]:
    inputs = [
        _tensor(contract.MESSAGES, contract.json_tensor([{"role": "user", "content": prompt}])),
        _tensor(
            contract.PARAMETERS, contract.json_tensor({"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
        ),
        _tensor(contract.STREAM, contract.bool_tensor(True)),
    ]
    if channel is not None:
        inputs.append(_tensor(contract.STREAM_CHANNEL, contract.bytes_tensor(channel)))
    return inputs


def _own_stream_to_its_end(responses: Responses) -> list[Any]:
    """Every response of a request's own stream up to its final flag (raises on an error)."""
    got = []
    while True:
        result, error = responses.get(timeout=60)
        if error is not None:
            raise error
        got.append(result)
        if _is_final(result):
            return got


def _channel_entries(responses: Responses, until: Callable[[list[ChannelEntry]], bool]) -> list[ChannelEntry]:
    entries: list[ChannelEntry] = []
    deadline = time.monotonic() + 60
    while not until(entries):
        result, error = responses.get(timeout=max(deadline - time.monotonic(), 0.1))
        assert error is None, error
        text = contract.read_string(result.as_numpy(contract.CHANNEL_DELTAS))
        if text:
            entries.extend(decode_entries(text))
    return entries


def _send_control(handle: TritonHandle, name: str, value: str) -> None:
    with _stream(handle) as (client, responses):
        client.async_stream_infer(
            handle.model_name, [_tensor(name, contract.bytes_tensor(value))], enable_empty_final_response=True
        )
        assert _own_stream_to_its_end(responses)[-1].get_response().outputs == []


@contextmanager
def _channel(handle: TritonHandle) -> Iterator[tuple[str, Responses]]:
    name = f"test-{uuid.uuid4().hex}"
    with _stream(handle) as (client, responses):
        client.async_stream_infer(
            handle.model_name,
            [_tensor(contract.OPEN_CHANNEL, contract.bytes_tensor(name))],
            enable_empty_final_response=True,
        )
        opened, error = responses.get(timeout=30)
        assert error is None, error
        assert contract.read_string(opened.as_numpy(contract.TEXT_OUTPUT)) == name and not _is_final(opened)
        yield name, responses
        _send_control(handle, contract.CANCEL_REQUEST, name)  # closes it: its stream ends
        assert _is_final(_channel_last(responses))


def _channel_last(responses: Responses) -> Any:
    while True:
        result, error = responses.get(timeout=30)
        assert error is None, error
        if _is_final(result):
            return result


def _texts(entries: list[ChannelEntry], request_id: str) -> str:
    return "".join(e.delta.text for e in entries if e.request_id == request_id and e.delta is not None)


def test_a_channel_carries_the_deltas_of_the_requests_that_name_it(triton_server: TritonHandle) -> None:
    prompts = {"a": "Hello there", "b": "Count to ten", "c": "Tell me a story"}
    expected = {}
    for key, prompt in prompts.items():  # the same requests on their own streams, for reference
        with _stream(triton_server) as (client, responses):
            client.async_stream_infer(
                triton_server.model_name, _chat(prompt, 12, None), enable_empty_final_response=True
            )
            results = _own_stream_to_its_end(responses)
        deltas = [
            contract.decode_delta({o.name: r.as_numpy(o.name) for o in r.get_response().outputs})
            for r in results
            if r.get_response().outputs
        ]
        expected[key] = "".join(d.text for d in deltas)
    with _channel(triton_server) as (name, channel_responses), _stream(triton_server) as (client, own):
        ids = {key: f"req-{key}-{uuid.uuid4().hex}" for key in prompts}
        for key, prompt in prompts.items():
            client.async_stream_infer(
                triton_server.model_name, _chat(prompt, 12, name), request_id=ids[key], enable_empty_final_response=True
            )
        entries = _channel_entries(channel_responses, lambda got: sum(e.last for e in got) == len(prompts))
        finals = [own.get(timeout=30) for _ in prompts]
    for key in prompts:
        mine = [e for e in entries if e.request_id == ids[key]]
        assert _texts(entries, ids[key]) == expected[key]  # greedy: the same text, whatever the batch
        assert mine[-1].last and not any(e.last for e in mine[:-1])
        last_delta = next(e.delta for e in reversed(mine) if e.delta is not None)
        assert last_delta.finish_reason == "length" and last_delta.usage is not None
        assert last_delta.usage.completion_tokens == 12
    # Each request's own stream carried only its final flag, no outputs.
    assert all(error is None and _is_final(result) and not result.get_response().outputs for result, error in finals)


def test_cancel_request_stops_a_request_on_a_channel(triton_server: TritonHandle) -> None:
    with _channel(triton_server) as (name, channel_responses), _stream(triton_server) as (client, own):
        request_id = f"long-{uuid.uuid4().hex}"
        client.async_stream_infer(
            triton_server.model_name,
            _chat("Write a long story", 400, name),
            request_id=request_id,
            enable_empty_final_response=True,
        )
        _channel_entries(channel_responses, lambda got: len(got) >= 3)
        started = time.monotonic()
        _send_control(triton_server, contract.CANCEL_REQUEST, request_id)
        result, error = own.get(timeout=10)
        assert error is None and _is_final(result)
        assert time.monotonic() - started < 2.0
        entries = _channel_entries(channel_responses, lambda got: any(e.last for e in got))
        assert entries[-1].request_id == request_id and entries[-1].last
        assert sum(1 for e in entries if e.delta is not None and e.delta.text) < 300  # it did not run to the end
    # The engine's gauge refreshes every 0.5 s; the slot is free.
    assert wait_for_gauge(triton_server, lambda value: value == 0, timeout=5) == 0


def test_a_request_naming_no_open_channel_gets_a_503_that_names_the_input(triton_server: TritonHandle) -> None:
    with _stream(triton_server) as (client, responses):
        client.async_stream_infer(
            triton_server.model_name, _chat("Hi", 4, "never-opened-channel"), enable_empty_final_response=True
        )
        result, error = responses.get(timeout=30)
    assert result is None and error is not None
    info = ErrorInfo.from_wire(str(error))
    assert (info.status, info.code, info.param) == (503, "channel_closed", contract.STREAM_CHANNEL)


def test_the_frontend_streams_the_same_with_and_without_channels(
    triton_server: TritonHandle, frontend_factory: Callable[..., str]
) -> None:
    body = {
        "model": triton_server.served_model_name,
        "messages": [{"role": "user", "content": "Say something"}],
        "max_tokens": 10,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    streams = []
    for url in (frontend_factory(), frontend_factory(response_channel=False)):
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        for chunk in chunks:  # what differs between any two requests
            chunk.pop("id"), chunk.pop("created")
            if chunk.get("usage"):
                chunk["usage"].pop("queue_wait_time")
        streams.append(chunks)
    assert streams[0] == streams[1]
    assert sum(1 for chunk in streams[0] for choice in chunk["choices"] if choice["delta"].get("content")) >= 2
