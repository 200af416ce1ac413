"""``TritonBackend`` without a server: the input tensors it builds and how it reads a response stream.

The aio client is replaced by a stand-in with the same ``stream_infer`` shape (an async iterator of
``(result, error)`` tuples with a ``cancel()`` method), fed with responses encoded by the contract.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor, serialize_byte_tensor

from openai_frontend.client.base import BackendError, BackendRequest
from openai_frontend.client.triton import READY_TIMEOUT_S, TritonBackend, build_infer_inputs
from python_backend.protocol import contract
from python_backend.protocol.contract import ChoiceDelta, ChoiceUsage, TokenLogprob, TopLogprob
from python_backend.protocol.errors import ErrorInfo
from tests.fakes.grpc import FakeClient

REQUEST = BackendRequest(
    request_id="chatcmpl-abc",
    messages=[{"role": "user", "content": "Grüß dich"}],
    parameters={"temperature": 0.5, "n": 2},
)


def _values(tensor: Any) -> np.ndarray:
    raw = tensor._get_content()  # the serialized bytes that go on the wire
    if tensor.datatype() == "BYTES":
        return deserialize_bytes_tensor(raw)
    return np.frombuffer(raw, dtype=np.bool_)


def test_build_infer_inputs_names_types_values() -> None:
    inputs = {t.name(): t for t in build_infer_inputs(REQUEST)}
    assert list(inputs) == [contract.MESSAGES, contract.PARAMETERS, contract.STREAM]
    assert {name: (t.datatype(), t.shape()) for name, t in inputs.items()} == {
        contract.MESSAGES: ("BYTES", [1]),
        contract.PARAMETERS: ("BYTES", [1]),
        contract.STREAM: ("BOOL", [1]),
    }
    assert json.loads(_values(inputs[contract.MESSAGES])[0]) == REQUEST.messages
    assert json.loads(_values(inputs[contract.PARAMETERS])[0]) == REQUEST.parameters
    assert _values(inputs[contract.STREAM]).tolist() == [True]


def test_a_raw_prompt_goes_as_text_input_without_the_models_echo() -> None:
    request = BackendRequest("cmpl-abc", [], {"max_tokens": 3}, stream=False, prompt="Once upon")
    inputs = {t.name(): t for t in build_infer_inputs(request)}
    assert list(inputs) == [contract.TEXT_INPUT, contract.EXCLUDE_INPUT_IN_OUTPUT, contract.PARAMETERS, contract.STREAM]
    assert _values(inputs[contract.TEXT_INPUT]).tolist() == [b"Once upon"]
    assert _values(inputs[contract.EXCLUDE_INPUT_IN_OUTPUT]).tolist() == [True]


def test_build_infer_inputs_with_media() -> None:
    req = BackendRequest("r", REQUEST.messages, {}, media=[(b"\x89PNG", "image/png"), (b"ID3", "audio/mpeg")])
    inputs = {t.name(): t for t in build_infer_inputs(req)}
    assert inputs[contract.MEDIA].datatype() == "BYTES" and inputs[contract.MEDIA].shape() == [2]
    assert _values(inputs[contract.MEDIA]).tolist() == [b"\x89PNG", b"ID3"]
    assert _values(inputs[contract.MEDIA_TYPES]).tolist() == [b"image/png", b"audio/mpeg"]


def _result(delta: ChoiceDelta | None, final: bool) -> InferResult:
    """A real ``InferResult`` over the wire message Triton sends for this delta (raw buffers)."""
    response = service_pb2.ModelInferResponse()
    datatypes = {spec.name: spec.datatype for spec in contract.OUTPUT_SPECS}
    for name, array in (contract.encode_delta(delta) if delta is not None else {}).items():
        output = response.outputs.add()
        output.name, output.datatype = name, datatypes[name]
        output.shape.extend(array.shape)
        raw = serialize_byte_tensor(array).item() if datatypes[name] == "BYTES" else array.tobytes()
        response.raw_output_contents.append(raw)
    response.parameters["triton_final_response"].bool_param = final
    return InferResult(response)


def _deltas() -> list[ChoiceDelta]:
    usage = ChoiceUsage(
        prompt_tokens=3, completion_tokens=2, batch_size=[1, 1], queue_wait_time=[9, 8], decode_time_arr=[5.0]
    )
    return [
        ChoiceDelta(0, text="He", num_output_tokens=1),
        ChoiceDelta(0, text="llo", finish_reason="stop", usage=usage),
    ]


async def _collect(backend: TritonBackend) -> list[ChoiceDelta]:
    return [delta async for delta in backend.generate(REQUEST)]


async def test_stream_decodes_deltas_and_skips_empty_final() -> None:
    first, second = _deltas()
    client = FakeClient([(_result(first, False), None), (_result(second, False), None), (_result(None, True), None)])
    backend = TritonBackend(client, "triton_chat", request_timeout_s=30)
    got = await _collect(backend)
    assert [d.text for d in got] == ["He", "llo"]
    assert got[1].finish_reason == "stop" and got[1].usage is not None and got[1].usage.queue_wait_time == [9, 8]
    await asyncio.sleep(0)
    assert client.sent[0]["model_name"] == "triton_chat"
    assert client.sent[0]["request_id"] == REQUEST.request_id
    assert client.sent[0]["stream_timeout"] == 30
    assert [t.name() for t in client.sent[0]["inputs"]] == [contract.MESSAGES, contract.PARAMETERS, contract.STREAM]


async def test_final_flag_on_a_data_response_ends_the_stream() -> None:
    first, second = _deltas()
    never = (_result(ChoiceDelta(0, text="never"), False), None)
    client = FakeClient([(_result(first, False), None), (_result(second, True), None), never])
    got = await _collect(TritonBackend(client, "m", 30))
    assert [d.text for d in got] == ["He", "llo"]


async def test_model_error_becomes_backend_error_with_its_status() -> None:
    info = ErrorInfo(400, "'top_k' must be ...", "invalid_request_error", "top_k")
    client = FakeClient([(None, InferenceServerException(msg=info.to_wire()))])
    with pytest.raises(BackendError) as caught:
        await _collect(TritonBackend(client, "m", 30))
    assert caught.value.info == info


async def test_triton_internal_error_is_a_generic_503() -> None:
    client = FakeClient([(None, InferenceServerException(msg="Stub process 'triton_chat_0' is not healthy."))])
    with pytest.raises(BackendError) as caught:
        await _collect(TritonBackend(client, "m", 30))
    assert caught.value.info.status == 503
    assert caught.value.info.message == "model backend unavailable"


@pytest.mark.parametrize(
    ("code", "status"), [(grpc.StatusCode.UNAVAILABLE, 503), (grpc.StatusCode.DEADLINE_EXCEEDED, 504)]
)
async def test_grpc_failures_are_mapped_without_details(code: grpc.StatusCode, status: int) -> None:
    error = grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="connect to 10.1.2.3:8001 failed"
    )
    client = FakeClient([error])
    with pytest.raises(BackendError) as caught:
        await _collect(TritonBackend(client, "m", 30))
    assert caught.value.info.status == status
    assert "10.1.2.3" not in caught.value.info.message


async def test_consumer_leaving_cancels_the_grpc_call() -> None:
    deltas = [(_result(ChoiceDelta(0, text=str(i)), False), None) for i in range(10)]
    client = FakeClient(deltas, delay_s=0.01)
    stream = TritonBackend(client, "m", 30).generate(REQUEST)
    assert (await anext(stream)).text == "0"
    await stream.aclose()
    assert client.streams[0].cancelled


async def test_task_cancellation_cancels_the_grpc_call() -> None:
    deltas = [(_result(ChoiceDelta(0, text=str(i)), False), None) for i in range(10)]
    client = FakeClient(deltas, delay_s=0.2)
    task = asyncio.create_task(_collect(TritonBackend(client, "m", 30)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.streams[0].cancelled


async def test_readiness_is_a_probe_inference_the_model_answers() -> None:
    client = FakeClient([(_result(ChoiceDelta(0, text='{"status": "ready"}'), True), None)])
    assert await TritonBackend(client, "m", 30).is_ready()
    await asyncio.gather(*client.drains)
    (probe,) = client.sent
    assert probe["model_name"] == "m" and probe["stream_timeout"] == READY_TIMEOUT_S
    assert [(t.name(), _values(t).tolist()) for t in probe["inputs"]] == [(contract.HEALTH_PROBE, [True])]
    assert not client.streams[0].cancelled  # answered: the stream ends by itself


async def test_readiness_fails_when_the_model_answers_with_an_error() -> None:
    stalled = ErrorInfo(503, "the engine has made no progress for 61 s", "service_unavailable", None, "engine_stalled")
    client = FakeClient([(None, InferenceServerException(msg=stalled.to_wire()))])
    assert not await TritonBackend(client, "m", 30).is_ready()
    # Triton's own refusal (an unloaded model, a stub it finds unhealthy) is a failure as well.
    client = FakeClient([(None, InferenceServerException(msg="Stub process 'x' is not healthy."))])
    assert not await TritonBackend(client, "m", 30).is_ready()


async def test_readiness_fails_when_the_stream_cannot_start_or_ends_unanswered() -> None:
    refused = FakeClient([], start_error=InferenceServerException(msg="connection refused"))
    assert not await TritonBackend(refused, "m", 30).is_ready()
    silent = FakeClient([])
    assert not await TritonBackend(silent, "m", 30).is_ready()


async def test_readiness_fails_within_its_timeout_when_the_model_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("openai_frontend.client.triton.READY_TIMEOUT_S", 0.2)
    hung = FakeClient([(_result(ChoiceDelta(0, text="late"), True), None)], delay_s=30)
    started = asyncio.get_running_loop().time()
    assert not await TritonBackend(hung, "m", 30).is_ready()
    assert asyncio.get_running_loop().time() - started < 1.5
    assert hung.streams[0].cancelled  # the unanswered probe does not stay in Triton


@pytest.mark.parametrize(
    "delta",
    [
        ChoiceDelta(0, text=""),
        ChoiceDelta(0, text="Grüß 你好 \x00\n"),
        ChoiceDelta(
            2,
            text="x",
            reasoning="hm",
            tool_calls=[{"index": 0, "function": {"name": "f", "arguments": "{}"}}],
            finish_reason="tool_calls",
            logprobs=[TokenLogprob("x", -0.5, [120], [TopLogprob("x", -0.5, [120])])],
            usage=ChoiceUsage(3, 1, batch_size=[4], queue_wait_time=[7]),
            num_input_tokens=3,
            num_output_tokens=1,
        ),
    ],
    ids=["empty", "unicode", "every-output"],
)
async def test_every_output_reads_back_from_the_raw_wire_buffers(delta: ChoiceDelta) -> None:
    client = FakeClient([(_result(delta, True), None)])
    got = await _collect(TritonBackend(client, "triton_chat", request_timeout_s=30))
    assert got == [delta]


async def test_readiness_callers_share_one_probe_and_its_answer_briefly(monkeypatch: pytest.MonkeyPatch) -> None:
    """/health/ready is open without a key: a flood of callers must not become a flood of probes."""
    answer = [(_result(ChoiceDelta(0, text='{"status": "ready"}'), True), None)]
    client = FakeClient(answer, delay_s=0.05)
    backend = TritonBackend(client, "m", 30)
    assert all(await asyncio.gather(*(backend.is_ready() for _ in range(20))))
    assert await backend.is_ready()  # within READY_REUSE_S of the answer
    assert len(client.streams) == 1
    monkeypatch.setattr("openai_frontend.client.triton.READY_REUSE_S", 0.0)
    assert await backend.is_ready()
    assert len(client.streams) == 2  # an answer older than READY_REUSE_S is asked again


async def test_a_caller_that_leaves_does_not_cancel_the_shared_probe() -> None:
    answer = [(_result(ChoiceDelta(0, text='{"status": "ready"}'), True), None)]
    client = FakeClient(answer, delay_s=0.1)
    backend = TritonBackend(client, "m", 30)
    leaving = asyncio.ensure_future(backend.is_ready())
    staying = asyncio.ensure_future(backend.is_ready())
    await asyncio.sleep(0.02)
    leaving.cancel()
    assert await staying
    assert not client.streams[0].cancelled
