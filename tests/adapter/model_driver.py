"""Drive ``TritonPythonModel`` as Triton's stub does: the requests a client sends, what came back.

``Served`` is an initialized model (the ``serve`` fixture makes them); the request helpers build
the input tensors of a chat, probe, cancel or channel request, and the readers decode what the
recording sender of the fake ``triton_python_backend_utils`` got.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from python_backend.protocol import contract
from python_backend.protocol.channel_wire import ChannelEntry, decode_entries
from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.errors import ErrorInfo
from tests.fakes import pb_utils
from tests.fakes.pb_utils import InferenceRequest, InferenceResponseSender, Sent, Tensor

MESSAGES = [{"role": "user", "content": "Say something."}]


@dataclass
class Served:
    """An initialized model; ``finalize`` is idempotent so a test may stop it itself."""

    model: Any
    finalized: bool = False

    def execute(self, *requests: InferenceRequest) -> None:
        assert self.model.execute(list(requests)) is None  # decoupled: responses go through senders

    def answer(self, request: InferenceRequest, timeout: float = 30.0) -> InferenceResponseSender:
        """Execute ``request`` and wait for its final response; its sender, with what it sent."""
        self.execute(request)
        sender = request.get_response_sender()
        sender.wait_final(timeout)
        return sender

    def finalize(self) -> None:
        if not self.finalized:
            self.finalized = True
            self.model.finalize()


def chat_request(
    request_id: str,
    *,
    stream: bool = False,
    parameters: dict[str, Any] | None = None,
    raw_parameters: str | None = None,
    channel: str | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> InferenceRequest:
    """The tensors the frontend sends for one chat request (``raw_parameters``: as given)."""
    inputs = [
        Tensor(contract.MESSAGES, contract.json_tensor(MESSAGES if messages is None else messages)),
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


def errors_of(*requests: InferenceRequest) -> list[ErrorInfo | None]:
    """Each request's error (None: answered), once each has ended with its one final response."""
    return [error_of(ended_once(request.get_response_sender())) for request in requests]


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
