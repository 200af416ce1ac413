"""Drive ``TritonPythonModel`` as Triton's stub does, against the fake ``triton_python_backend_utils``.

``serve`` initializes the model on the tiny model folder (with the real engine, unless a test
swaps it) and finalizes it at the end; the request helpers build the input tensors a client sends
and read back what the recording sender got.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry, decode_entries
from python_backend.protocol.contract import ChoiceDelta, ErrorInfo
from tests.fakes import pb_utils
from tests.fakes.pb_utils import InferenceRequest, InferenceResponseSender, Sent, Tensor

MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture
def adapter(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``python_backend.triton.model``, imported against the fake module for this test only."""
    return pb_utils.install(monkeypatch)


@dataclass
class Served:
    """An initialized model; ``finalize`` is idempotent so a test may stop it itself."""

    model: Any
    finalized: bool = False
    senders: list[InferenceResponseSender] = field(default_factory=list)

    def execute(self, *requests: InferenceRequest) -> None:
        self.senders += [r.get_response_sender() for r in requests]
        assert self.model.execute(list(requests)) is None  # decoupled: responses go through senders

    def finalize(self) -> None:
        if not self.finalized:
            self.finalized = True
            self.model.finalize()


@pytest.fixture
def serve(adapter: types.ModuleType, tiny_model_dir: Path) -> Iterator[Callable[..., Served]]:
    """Initialize the model on the tiny model with extra model parameters; finalize at the end."""
    threads = torch.get_num_threads()  # initialize serializes the calling thread, as in the stub
    served: list[Served] = []

    def start(**parameters: str) -> Served:
        values = {"model_path": str(tiny_model_dir), "device": "cpu", "dtype": "float32", **parameters}
        config = {
            "model_transaction_policy": {"decoupled": True},
            "parameters": {key: {"string_value": value} for key, value in values.items()},
        }
        model = adapter.TritonPythonModel()
        model.initialize({"model_config": json.dumps(config)})
        served.append(Served(model))
        return served[-1]

    yield start
    for one in served:
        one.finalize()
    torch.set_num_threads(threads)


def chat_request(
    request_id: str,
    *,
    stream: bool = False,
    parameters: dict[str, Any] | None = None,
    raw_parameters: str | None = None,
    channel: str | None = None,
) -> InferenceRequest:
    """The tensors the frontend sends for one chat request (``raw_parameters``: as given)."""
    inputs = [
        Tensor(contract.MESSAGES, contract.json_tensor(MESSAGES)),
        Tensor(contract.STREAM, contract.bool_tensor(stream)),
    ]
    if raw_parameters is not None:
        inputs.append(Tensor(contract.PARAMETERS, contract.bytes_tensor(raw_parameters)))
    elif parameters is not None:
        inputs.append(Tensor(contract.PARAMETERS, contract.json_tensor(parameters)))
    if channel is not None:
        inputs.append(Tensor(contract.STREAM_CHANNEL, contract.bytes_tensor(channel)))
    return InferenceRequest(inputs, request_id=request_id)


def control_request(name: str, value: str | bool, request_id: str = "") -> InferenceRequest:
    """A probe (``health_probe``), ``cancel_request`` or ``open_channel`` request."""
    array = contract.bool_tensor(value) if isinstance(value, bool) else contract.bytes_tensor(value)
    return InferenceRequest([Tensor(name, array)], request_id=request_id)


def delta_of(sent: Sent) -> ChoiceDelta | None:
    """The delta a data response carries; None for a flags-only one."""
    if sent.response is None:
        return None
    assert not sent.response.has_error(), sent.response.error()
    return contract.decode_delta({t.name(): t.as_numpy() for t in sent.response.output_tensors()})


def error_of(sent: Sent) -> ErrorInfo | None:
    error = None if sent.response is None else sent.response.error()
    return None if error is None else ErrorInfo.from_wire(error.message())


def text_of(sender: InferenceResponseSender) -> str:
    return "".join(d.text for d in map(delta_of, sender.sent) if d is not None)


def entries_of(channel: InferenceResponseSender) -> list[ChannelEntry]:
    """Every entry the channel carried, in order (its first response, the open answer, aside)."""
    entries = []
    for sent in channel.sent[1:]:
        tensor = (
            None
            if sent.response is None
            else pb_utils.get_output_tensor_by_name(sent.response, contract.CHANNEL_DELTAS)
        )
        if tensor is not None:
            entries += decode_entries(contract.read_string(tensor.as_numpy()) or "")
    return entries


def ended_once(sender: InferenceResponseSender) -> Sent:
    """The request's one final response; call once nothing more can be sent (after finalize)."""
    finals = sender.finals()
    assert len(finals) == 1, sender.sent
    assert sender.sent[-1] is finals[0]  # nothing after it
    assert sender.refused == [] and sender.asked_after_final == 0
    return finals[0]
