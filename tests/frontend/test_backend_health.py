"""A backend outage as the frontend's users and operators see it, with scripted probes and clients.

``BackendHealth`` (``client/health.py``) says down after ``MISSES_TO_DOWN`` failed or unanswered
probes in a row with no stream answering meanwhile, and up after one answered: one warning line per change, the ``backend_up`` gauge and the
``backend_outages_total`` counter on ``/metrics``. While down, ``TritonBackend`` answers every
call with 503 ``backend_unavailable`` without a gRPC call, and calls in flight (a stopped server
accepts them and never answers) fail when the state changes, not at their deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from openai_frontend import app as app_module
from openai_frontend.app import create_app
from openai_frontend.client.base import BackendError, BackendRequest
from openai_frontend.client.channel import ResponseChannel
from openai_frontend.client.health import MISSES_TO_DOWN, BackendHealth
from openai_frontend.client.own_stream import rpc_error
from openai_frontend.client.triton import TritonBackend
from openai_frontend.http.metrics import FrontendMetrics
from python_backend.protocol.tokenize import TokenizeQuery
from tests.fakes.grpc import ChannelModel, FakeClient, FakeStream
from tests.frontend.frontend_fakes import chat_body, settings

HEALTH_LOGGER = "openai_frontend.client.health"
WAIT_S = 5.0  # bound on any wait for something that happens at once; never reached when it works
REQUEST = BackendRequest("chatcmpl-1", [{"role": "user", "content": "hi"}], {}, stream=False)


class Probes:
    """A scripted probe: ``answers`` True (answered) / False (refused), or "hang" (never answers)."""

    def __init__(self) -> None:
        self.answer: bool | str = True
        self.calls = 0
        self.called = asyncio.Event()

    async def __call__(self, timeout_s: float) -> str | None:
        self.calls += 1
        self.called.set()
        if self.answer == "hang":
            await asyncio.Event().wait()  # a stopped server: cut by the health's own deadline
        return None if self.answer is True else "UNAVAILABLE: connection refused"


class SilentClient:
    """A stopped tritonserver: every call is accepted and never answered."""

    def __init__(self) -> None:
        self.streams: list[FakeStream] = []

    def stream_infer(self, inputs_iterator: Any, stream_timeout: float | None = None) -> FakeStream:
        self.streams.append(FakeStream())  # fed by nobody
        return self.streams[-1]

    async def close(self) -> None:
        pass


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def _down(health: BackendHealth, probes: Probes) -> None:
    probes.answer = False
    for _ in range(MISSES_TO_DOWN):
        await health.check()
    assert not health.up


async def test_one_warning_per_change_of_state_however_many_probes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    probes, changes = Probes(), list[bool]()
    health = BackendHealth(probes, 0.5, changes.append)
    await health.check()
    assert health.up and changes == [] and _warnings(caplog) == []
    probes.answer = False
    for _ in range(20):
        await health.check()
    assert not health.up and changes == [False]
    assert health.down_signal().done()
    (down,) = _warnings(caplog)
    assert "tritonserver is not answering (UNAVAILABLE: connection refused)" in down
    assert "503 backend_unavailable" in down
    probes.answer = True
    for _ in range(20):
        await health.check()
    assert health.up and changes == [False, True]
    assert not health.down_signal().done()  # a fresh one for the requests that come now
    assert len(_warnings(caplog)) == 2 and "tritonserver answers again after" in _warnings(caplog)[1]
    assert all(r.name == HEALTH_LOGGER for r in caplog.records if r.levelno >= logging.WARNING)


async def test_unanswered_probes_in_a_row_are_down_within_their_intervals() -> None:
    probes = Probes()
    probes.answer = "hang"
    changes: list[bool] = []
    health = BackendHealth(probes, 0.2, changes.append)
    started = time.monotonic()
    health.start()
    try:
        while health.up and time.monotonic() - started < WAIT_S:
            await asyncio.sleep(0.01)
        assert not health.up and changes == [False]
        assert probes.calls == MISSES_TO_DOWN  # one after the other, no interval between misses
    finally:
        await health.close()


async def test_one_late_probe_is_not_an_outage() -> None:
    probes, changes = Probes(), list[bool]()
    health = BackendHealth(probes, 0.5, changes.append)
    probes.answer = False
    for _ in range(MISSES_TO_DOWN - 1):
        await health.check()
    probes.answer = True
    await health.check()
    probes.answer = False
    for _ in range(MISSES_TO_DOWN - 1):
        await health.check()
    assert health.up and changes == []


async def test_a_probe_late_on_a_busy_host_is_no_miss_while_streams_get_answers() -> None:
    class LateProbe(Probes):
        """tritonserver serving streams but answering ServerLive past its deadline."""

        def __init__(self, health: list[BackendHealth]) -> None:
            super().__init__()
            self.health = health

        async def __call__(self, timeout_s: float) -> str | None:
            self.calls += 1
            self.health[0].heard_from()  # a stream's response arrives while the probe waits
            return "DEADLINE_EXCEEDED: Deadline Exceeded"

    holder: list[BackendHealth] = []
    probes, changes = LateProbe(holder), list[bool]()
    health = BackendHealth(probes, 0.5, changes.append)
    holder.append(health)
    for _ in range(3 * MISSES_TO_DOWN):
        await health.check()
    assert health.up and changes == [] and not health.down_signal().done()


async def test_the_outage_is_a_gauge_and_a_counter_on_metrics() -> None:
    metrics = FrontendMetrics("tiny-chat")
    probes = Probes()
    health = BackendHealth(probes, 0.5, metrics.backend_state)

    def values() -> dict[str, float]:
        families = text_string_to_metric_families(metrics.render().decode())
        return {
            s.name: s.value for f in families for s in f.samples if s.name in ("backend_up", "backend_outages_total")
        }

    assert values() == {"backend_up": 1.0, "backend_outages_total": 0.0}
    for _ in range(2):  # two outages, each of many failed probes
        await _down(health, probes)
        await health.check()
        assert values()["backend_up"] == 0.0
        probes.answer = True
        await health.check()
    assert values() == {"backend_up": 1.0, "backend_outages_total": 2.0}


async def test_an_unreachable_call_probes_at_once_and_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    probes = Probes()
    health = BackendHealth(probes, 60.0)  # the loop's next probe is a minute away
    health.start()
    try:
        await asyncio.wait_for(probes.called.wait(), WAIT_S)  # the first probe runs at start
        probes.called.clear()
        unavailable = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata())
        caplog.set_level(logging.WARNING)
        error = rpc_error(unavailable, 30.0, health)
        assert error.info.status == 503 and error.info.code == "backend_unavailable"
        await asyncio.wait_for(probes.called.wait(), WAIT_S)
        assert probes.calls == 2 and _warnings(caplog) == []
    finally:
        await health.close()


async def test_while_down_calls_fail_at_once_without_reaching_triton() -> None:
    client, probes = SilentClient(), Probes()
    health = BackendHealth(probes, 0.5)
    backend = TritonBackend(client, "triton_chat", 600, health=health)
    await _down(health, probes)
    for request in (REQUEST, BackendRequest("chatcmpl-2", [], {}, stream=True)):
        with pytest.raises(BackendError) as caught:
            await asyncio.wait_for(anext(backend.generate(request)), WAIT_S)
        assert caught.value.info.status == 503 and caught.value.info.code == "backend_unavailable"
    with pytest.raises(BackendError) as caught:
        await asyncio.wait_for(backend.tokenize(TokenizeQuery(prompt="hi")), WAIT_S)
    assert caught.value.info.code == "backend_unavailable"
    assert not await asyncio.wait_for(backend.is_ready(), WAIT_S)
    assert client.streams == []  # not one call went to the stopped server


async def test_requests_in_flight_fail_when_it_goes_down_and_their_calls_are_cancelled() -> None:
    client, probes = SilentClient(), Probes()
    health = BackendHealth(probes, 0.5)
    backend = TritonBackend(client, "triton_chat", 600, health=health)
    waiting = asyncio.ensure_future(anext(backend.generate(REQUEST)))
    asking = asyncio.ensure_future(backend.tokenize(TokenizeQuery(prompt="hi")))
    for _ in range(200):  # both calls are on their way to the silent server
        if len(client.streams) == 2:
            break
        await asyncio.sleep(0.005)
    assert len(client.streams) == 2 and not waiting.done()
    await _down(health, probes)
    for task in (waiting, asking):
        with pytest.raises(BackendError) as caught:
            await asyncio.wait_for(task, WAIT_S)
        assert caught.value.info.code == "backend_unavailable"
    chat, tokenize = client.streams
    assert chat.cancelled  # the call itself: Triton sees the cancel once it answers again
    assert tokenize.reads_cancelled == 1  # grpc.aio cancels a call whose read is cancelled


async def test_a_request_on_the_response_channel_fails_when_it_goes_down() -> None:
    model, probes = ChannelModel(), Probes()
    health = BackendHealth(probes, 0.5)
    backend = TritonBackend(model, "triton_chat", 600, ResponseChannel(model, "triton_chat"), health)
    request = BackendRequest("chatcmpl-3", [{"role": "user", "content": "hi"}], {}, stream=True)
    waiting = asyncio.ensure_future(anext(backend.generate(request)))
    await model.sent(1)
    own = model.requests["chatcmpl-3"]
    await _down(health, probes)
    with pytest.raises(BackendError) as caught:
        await asyncio.wait_for(waiting, WAIT_S)
    assert caught.value.info.code == "backend_unavailable"
    assert own.cancelled and model.cancels == []  # no cancel_request to a server that cannot answer


async def test_the_http_answers_while_down_are_503_with_retry_after_and_not_ready() -> None:
    client, probes = SilentClient(), Probes()
    health = BackendHealth(probes, 0.5)
    app = create_app(settings(), TritonBackend(client, "triton_chat", 600, health=health))
    await _down(health, probes)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        for stream in (False, True):
            reply = await asyncio.wait_for(http.post("/v1/chat/completions", json=chat_body(stream=stream)), WAIT_S)
            assert reply.status_code == 503 and reply.headers["retry-after"]
            assert reply.json()["error"]["code"] == "backend_unavailable"
        assert (await http.get("/health/ready")).status_code == 503
        assert (await http.get("/health")).status_code == 200  # the frontend itself is alive
    assert client.streams == []


async def test_a_response_read_on_a_stream_counts_as_an_answer() -> None:
    info_error = InferenceServerException(msg="the model is busy")
    client, probes = FakeClient([(None, info_error)], delay_s=0.05), Probes()
    probes.answer = "hang"  # ServerLive stuck behind a busy host
    health = BackendHealth(probes, 0.2)
    backend = TritonBackend(client, "triton_chat", 600, health=health)
    for _ in range(MISSES_TO_DOWN):
        answered = asyncio.ensure_future(anext(backend.generate(REQUEST)))
        await asyncio.wait_for(health.check(), WAIT_S)
        with pytest.raises(BackendError):
            await asyncio.wait_for(answered, WAIT_S)
    assert health.up and len(client.streams) == MISSES_TO_DOWN


async def test_closing_as_a_probe_answers_stops_the_probe_loop() -> None:
    # The launcher's shutdown closes the health while probes run. A close whose cancel landed in
    # the loop turn in which a probe answered was swallowed by Python 3.10/3.11's wait_for: the
    # loop probed on and the shutdown waited for it forever (the launcher never exited).
    answered = asyncio.get_running_loop().create_future()
    asked = asyncio.Event()

    async def probe(timeout_s: float) -> str | None:
        asked.set()
        return await answered

    health = BackendHealth(probe, 60.0)
    health.start()
    await asyncio.wait_for(asked.wait(), WAIT_S)
    answered.set_result(None)  # the probe ends in the next loop turn, as the close's cancel lands
    closing = asyncio.ensure_future(health.close())
    done, _ = await asyncio.wait({closing}, timeout=WAIT_S)  # asyncio.wait cancels nothing
    assert done == {closing}, "the probe loop ran on after its close"
    closing.result()


async def test_a_close_that_never_ends_does_not_hold_the_shutdown(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The app's own Triton client is closed on shutdown; however that close gets stuck, the
    # process must still stop (the launcher once hung there forever, killed by its supervisor).
    closing, cancelled = asyncio.Event(), asyncio.Event()

    class StuckBackend:
        async def close(self) -> None:
            closing.set()
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()

    monkeypatch.setattr(TritonBackend, "from_settings", staticmethod(lambda *args, **kwargs: StuckBackend()))
    monkeypatch.setattr(app_module, "BACKEND_CLOSE_S", 0.05)
    app = create_app(settings())
    async with app.router.lifespan_context(app):
        assert app.state.frontend.backend is not None
    assert closing.is_set() and app.state.frontend.backend is None
    await asyncio.wait_for(cancelled.wait(), WAIT_S)  # left behind, cancelled
    assert any("closing the Triton client took over 0.05 s" in m for m in _warnings(caplog))
