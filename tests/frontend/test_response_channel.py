"""Streamed deltas over the response channel, against a scripted stand-in for the model.

The stand-in answers the three kinds of call the frontend makes when channels are on: the
channel itself (``open_channel``: an answer that it is open, then one response per "pass"), the
requests that name it (``stream_channel``: their own streams carry only an error or the end), and
``cancel_request``. What a user of ``TritonBackend.generate`` sees must not change: the same
deltas in order, the same errors, and a client that leaves cancels its request.
"""

from __future__ import annotations

import asyncio

import pytest
from tritonclient.utils import InferenceServerException

from openai_frontend.client.base import BackendError, BackendRequest
from openai_frontend.client.channel import ResponseChannel
from openai_frontend.client.triton import TritonBackend
from python_backend.protocol.channel_wire import ChannelEntry
from python_backend.protocol.contract import ChoiceDelta, ChoiceUsage
from python_backend.protocol.errors import ErrorInfo
from tests.fakes.grpc import END, ChannelModel


def _backend(model: ChannelModel) -> TritonBackend:
    return TritonBackend(model, "triton_chat", 30, ResponseChannel(model, "triton_chat"))


def _request(request_id: str, stream: bool = True) -> BackendRequest:
    return BackendRequest(request_id, [{"role": "user", "content": "hi"}], {}, stream=stream)


async def _collect(backend: TritonBackend, request: BackendRequest) -> list[ChoiceDelta]:
    return [delta async for delta in backend.generate(request)]


async def test_each_request_gets_its_own_deltas_from_shared_pass_responses() -> None:
    model = ChannelModel()
    backend = _backend(model)
    tasks = [asyncio.ensure_future(_collect(backend, _request(f"r{i}"))) for i in range(3)]
    await model.sent(3)
    assert len(model.channels) == 1  # three concurrent requests opened one channel
    usage = ChoiceUsage(prompt_tokens=2, completion_tokens=2, batch_size=[3, 3], queue_wait_time=[5, 6])
    model.send_pass([ChannelEntry(f"r{i}", ChoiceDelta(0, text=f"a{i}", num_output_tokens=1)) for i in range(3)])
    model.send_pass(
        [
            ChannelEntry("r0", ChoiceDelta(0, text="b0", finish_reason="stop", usage=usage), last=True),
            ChannelEntry("r1", ChoiceDelta(1, text="b1")),
            ChannelEntry("r2", None, last=True),
        ]
    )
    model.send("r1", ChoiceDelta(1, text="c1", finish_reason="length"), last=True)
    got = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert [[d.text for d in deltas] for deltas in got] == [["a0", "b0"], ["a1", "b1", "c1"], ["a2"]]
    assert got[0][1].usage == usage and got[0][1].finish_reason == "stop"
    assert [d.index for d in got[1]] == [0, 1, 1]
    assert model.cancels == []  # each ended by itself: nothing to cancel


async def test_a_model_error_on_the_requests_own_stream_is_the_users_error() -> None:
    model = ChannelModel()
    task = asyncio.ensure_future(_collect(_backend(model), _request("r0")))
    await model.sent(1)
    info = ErrorInfo(400, "'top_k' must be ...", "invalid_request_error", "top_k")
    model.requests["r0"].queue.put_nowait((None, InferenceServerException(msg=info.to_wire())))
    model.requests["r0"].queue.put_nowait(END)
    with pytest.raises(BackendError) as caught:
        await asyncio.wait_for(task, 5)
    assert caught.value.info == info


async def test_a_lost_channel_fails_its_requests_with_503_and_the_next_request_opens_another() -> None:
    model = ChannelModel()
    backend = _backend(model)
    task = asyncio.ensure_future(_collect(backend, _request("r0")))
    await model.sent(1)
    model.send("r0", ChoiceDelta(0, text="a"))
    model.channels[0].queue.put_nowait(END)  # tritonserver went away, say
    with pytest.raises(BackendError) as caught:
        await asyncio.wait_for(task, 5)
    assert caught.value.info.status == 503 and caught.value.info.code == "backend_unavailable"
    task = asyncio.ensure_future(_collect(backend, _request("r1")))
    await model.sent(1)
    assert len(model.channels) == 2
    model.send("r1", ChoiceDelta(0, text="fine", finish_reason="stop"), last=True)
    assert [d.text for d in await asyncio.wait_for(task, 5)] == ["fine"]


async def test_a_consumer_that_leaves_cancels_through_the_model_without_a_grpc_cancel() -> None:
    model = ChannelModel()
    stream = _backend(model).generate(_request("r0"))
    first = asyncio.ensure_future(anext(stream))
    await model.sent(1)
    own = model.requests["r0"]
    model.send("r0", ChoiceDelta(0, text="a"))
    assert (await asyncio.wait_for(first, 5)).text == "a"
    await asyncio.wait_for(stream.aclose(), 5)
    assert model.cancels == ["r0"]
    assert not own.cancelled  # its own stream ended with the final flag, not under a read


async def test_channels_rotate_and_a_retired_one_closes_when_its_last_request_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tritonserver keeps a request's responses until it ends: no channel may live for ever."""
    monkeypatch.setattr("openai_frontend.client.channel.ROTATE_AFTER", 2)
    model = ChannelModel()
    backend = _backend(model)
    first = asyncio.ensure_future(_collect(backend, _request("r0")))
    await model.sent(1)
    (old_name,) = model.names
    model.send("r0", ChoiceDelta(0, text="a"))
    model.send("r0", ChoiceDelta(0, text="b"))  # the channel's second response: it retires
    for _ in range(200):  # until the frontend has read both
        if model.channels[0].queue.empty():
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(_collect(backend, _request("r1")))
    await model.sent(2)
    assert len(model.channels) == 2 and model.bound["r1"] is not model.bound["r0"]
    assert model.cancels == []  # still carrying r0
    model.send("r0", ChoiceDelta(0, text="c", finish_reason="length"), last=True)
    assert [d.text for d in await asyncio.wait_for(first, 5)] == ["a", "b", "c"]
    for _ in range(200):
        if model.cancels:
            break
        await asyncio.sleep(0.005)
    assert model.cancels == [old_name] and old_name not in model.names  # closed through the model
    model.send("r1", ChoiceDelta(0, text="fine", finish_reason="stop"), last=True)
    assert [d.text for d in await asyncio.wait_for(second, 5)] == ["fine"]


async def test_closing_the_backend_asks_the_model_to_end_the_channel() -> None:
    model = ChannelModel()
    backend = _backend(model)
    task = asyncio.ensure_future(_collect(backend, _request("r0")))
    await model.sent(1)
    model.send("r0", ChoiceDelta(0, text="done", finish_reason="stop"), last=True)
    await asyncio.wait_for(task, 5)
    (name,) = model.names
    await asyncio.wait_for(backend.close(), 5)
    assert model.cancels == [name] and model.names == {}
    assert not model.channels[0].cancelled  # it ended with its final flag


async def test_non_streaming_requests_and_a_model_without_channels_use_per_request_streams() -> None:
    model = ChannelModel(refuse_channels=True)
    backend = _backend(model)
    task = asyncio.ensure_future(_collect(backend, _request("r0")))
    for _ in range(200):
        if model.plain:
            break
        await asyncio.sleep(0.005)
    assert model.plain == ["r0"] and model.channels == []
    task.cancel()
    whole = ChannelModel()
    task = asyncio.ensure_future(_collect(_backend(whole), _request("r1", stream=False)))
    for _ in range(200):
        if whole.plain:
            break
        await asyncio.sleep(0.005)
    assert whole.plain == ["r1"] and whole.channels == []  # one response per choice anyway
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
