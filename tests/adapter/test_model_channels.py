"""Response channels through ``TritonPythonModel``: the channel and each request on it end once.

A channel is an ``open_channel`` request whose stream carries every bound request's deltas; the
bound requests' own streams carry only their end or their error. The channel ends when its caller
names it in ``cancel_request``, when its caller goes away, or when the model stops.
"""

from __future__ import annotations

from collections.abc import Callable

from python_backend.protocol import contract
from python_backend.triton.channels import CANCEL_CHECK_S
from tests.adapter.model_driver import Served, chat_request, control_request, delta_of, ended_once, entries_of, error_of
from tests.fakes.pb_utils import InferenceRequest

NAME = "channel-adapter-01"
LONG = {"max_tokens": 4000, "ignore_eos": True}
LONG_SERVER = {"max_iter_times": "4096"}


def _open(served: Served) -> InferenceRequest:
    channel = control_request(contract.OPEN_CHANNEL, NAME, "channel-request")
    served.execute(channel)
    (opened,) = channel.get_response_sender().wait_for(lambda sent: len(sent) >= 1)
    delta = delta_of(opened)
    assert not opened.final and delta is not None and delta.text == NAME  # the channel is open
    return channel


def test_deltas_go_on_the_channel_and_each_stream_carries_only_its_end(serve: Callable[..., Served]) -> None:
    served = serve()
    channel = _open(served)
    bound = chat_request("bound", stream=True, parameters={"max_tokens": 5, "ignore_eos": True}, channel=NAME)
    served.answer(bound)
    close = control_request(contract.CANCEL_REQUEST, NAME, "closer")
    served.execute(close)
    channel.get_response_sender().wait_final()
    close.get_response_sender().wait_final()
    served.finalize()
    own = bound.get_response_sender()
    assert [s.response for s in own.sent] == [None]  # just the final flag
    ended_once(own)
    entries = entries_of(channel.get_response_sender())
    assert {e.request_id for e in entries} == {"bound"}
    assert [e.last for e in entries] == [False] * (len(entries) - 1) + [True]
    assert entries[-1].delta is not None and entries[-1].delta.finish_reason == contract.FINISH_LENGTH
    assert channel.get_response_sender().sent[-1].response is None
    ended_once(channel.get_response_sender())
    ended_once(close.get_response_sender())


def test_a_channel_whose_caller_left_closes_and_stops_its_requests(serve: Callable[..., Served]) -> None:
    served = serve(**LONG_SERVER)
    channel = _open(served)
    bound = chat_request("bound", stream=True, parameters=LONG, channel=NAME)
    served.execute(bound)
    channel.get_response_sender().wait_for(lambda sent: len(sent) >= 2)  # generating
    channel.get_response_sender().cancel()
    channel.get_response_sender().wait_final(timeout=CANCEL_CHECK_S * 10)
    bound.get_response_sender().wait_final()
    served.finalize()
    ended_once(channel.get_response_sender())
    assert error_of(ended_once(bound.get_response_sender())) is None  # stopped, as a cancel
    assert len(entries_of(channel.get_response_sender())) < LONG["max_tokens"]


def test_a_request_naming_no_open_channel_is_one_503(serve: Callable[..., Served]) -> None:
    served = serve()
    request = chat_request("orphan", stream=True, parameters={"max_tokens": 4}, channel="channel-never-open")
    served.execute(request)
    served.finalize()
    sender = request.get_response_sender()
    error = error_of(ended_once(sender))
    assert len(sender.sent) == 1
    assert error is not None and (error.status, error.code) == (503, "channel_closed")


def test_a_second_channel_of_the_same_name_is_refused_once(serve: Callable[..., Served]) -> None:
    served = serve()
    first = _open(served)
    second = control_request(contract.OPEN_CHANNEL, NAME, "channel-request-2")
    served.execute(second)
    served.finalize()
    error = error_of(ended_once(second.get_response_sender()))
    assert error is not None and (error.status, error.param) == (400, contract.OPEN_CHANNEL)
    ended_once(first.get_response_sender())  # the model's stop ended the open one


def test_finalize_ends_open_channels_and_their_requests_in_flight(serve: Callable[..., Served]) -> None:
    served = serve(**LONG_SERVER)
    channel = _open(served)
    bound = chat_request("bound", stream=True, parameters=LONG, channel=NAME)
    served.execute(bound)
    channel.get_response_sender().wait_for(lambda sent: len(sent) >= 2)
    served.finalize()
    assert channel.get_response_sender().sent[-1].response is None
    ended_once(channel.get_response_sender())
    error = error_of(ended_once(bound.get_response_sender()))
    assert error is not None and (error.status, error.code) == (503, "shutting_down")
