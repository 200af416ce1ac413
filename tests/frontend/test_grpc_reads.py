"""``GuardedReads``: a consumer that leaves never cancels a gRPC read in flight (grpc/grpc#43360
leaks native memory then); the call is cancelled once the read is done, or after the grace."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openai_frontend.client import reads as grpc_reads
from openai_frontend.client.reads import GuardedReads
from tests.fakes.grpc import FakeStream


async def _leave_after(reads: GuardedReads, after_s: float, ends: Any = lambda item: item == "final") -> None:
    async def consume() -> None:
        async for _ in reads:
            pass

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(after_s)  # the consumer's own pace: this is the client's leaving time
    task.cancel()  # the client disconnects while the consumer waits for the next item
    with pytest.raises(asyncio.CancelledError):
        await task
    await reads.cancel_when_idle(ends)


async def test_a_consumer_that_leaves_waits_for_the_read_then_cancels() -> None:
    stream = FakeStream(["a", "b", "c", "d"], delay_s=0.04)
    await _leave_after(GuardedReads(stream), 0.06)  # leaves during the second read
    assert stream.reads_cancelled == 0
    assert stream.cancelled and not stream.cancelled_while_reading


async def test_no_cancel_when_the_read_in_flight_ended_the_stream() -> None:
    stream = FakeStream(["a", "final"], delay_s=0.04)
    await _leave_after(GuardedReads(stream), 0.06)
    assert not stream.cancelled  # the final response came: Triton must not see a cancel after it


async def test_after_the_grace_the_call_is_cancelled_under_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_reads, "CANCEL_GRACE_S", 0.05)
    stream = FakeStream(["a"], delay_s=5.0)  # a request still queued: no token for a long time
    started = asyncio.get_running_loop().time()
    await _leave_after(GuardedReads(stream), 0.02)
    assert stream.cancelled and stream.cancelled_while_reading
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_reads_pass_items_and_the_end_through() -> None:
    stream = FakeStream(["a", "b"], delay_s=0.0)
    assert [item async for item in GuardedReads(stream)] == ["a", "b"]
