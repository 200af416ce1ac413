"""``openai_frontend.aio.within``: a bounded wait whose caller's cancellation always propagates,
which ``asyncio.wait_for`` before Python 3.12 does not (the launcher once hung at shutdown on
it)."""

from __future__ import annotations

import asyncio

import pytest

from openai_frontend.aio import within

WAIT_S = 5.0  # bound on a wait for something that happens at once; never reached when it works


async def test_the_result_or_the_error_comes_back() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def fail() -> None:
        raise ValueError("bad")

    assert await within(answer(), WAIT_S) == 42
    with pytest.raises(ValueError, match="bad"):
        await within(fail(), WAIT_S)


async def test_a_timeout_cancels_the_work_and_waits_for_its_cleanup() -> None:
    cleaned = asyncio.Event()

    async def stalled() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits ends before the timeout is raised
            cleaned.set()

    with pytest.raises(asyncio.TimeoutError):
        await within(stalled(), 0.01)
    assert cleaned.is_set()


async def test_the_callers_cancel_lands_even_as_the_result_arrives() -> None:
    result = asyncio.get_running_loop().create_future()
    asked = asyncio.Event()
    after: list[str] = []

    async def waiting() -> int:
        asked.set()
        return await result

    async def caller() -> None:
        await within(waiting(), WAIT_S)
        after.append("ran on")  # wait_for (3.10, 3.11) got here: the cancel was swallowed

    task = asyncio.ensure_future(caller())
    await within(asked.wait(), WAIT_S)
    result.set_result(1)  # the work ends in the next loop turn, the turn the cancel lands in
    task.cancel()
    await asyncio.wait({task}, timeout=WAIT_S)
    assert task.cancelled() and after == []


async def test_the_callers_cancel_cancels_the_work_and_waits_for_it() -> None:
    asked, cleaned = asyncio.Event(), asyncio.Event()

    async def stalled() -> None:
        asked.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            cleaned.set()

    task = asyncio.ensure_future(within(stalled(), WAIT_S))
    await asyncio.wait_for(asked.wait(), WAIT_S)
    task.cancel()
    await asyncio.wait({task}, timeout=WAIT_S)
    assert task.cancelled() and cleaned.is_set()
