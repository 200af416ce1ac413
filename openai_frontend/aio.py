"""asyncio waits that behave alike on every Python the frontend supports (3.10 on).

Owns ``within``, the frontend's one bounded wait, in place of ``asyncio.wait_for``: before Python
3.12, ``wait_for`` returns the awaited result when the caller is cancelled in the same loop turn
in which that result arrives, and so swallows the cancellation. A loop stopped by cancelling its
task (the backend's health probes) then ran on, and the shutdown that waited for it never ended.
Also ``retrieve_outcome``, the done callback for work left behind (here and in ``client.reads``).
Every frontend package may import this module; it imports the standard library only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``awaitable``'s result, or ``asyncio.TimeoutError`` once ``timeout_s`` has passed.

    As ``wait_for``: on the timeout, or when the caller is cancelled, the awaited work is cancelled
    and has ended before this returns or raises. Unlike ``wait_for`` before 3.12, the caller's
    cancellation always propagates.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait({task}, timeout=timeout_s)
    except BaseException:
        await _cancel_and_wait(task)
        raise
    if task.done():
        return task.result()
    await _cancel_and_wait(task)
    if task.cancelled():
        raise asyncio.TimeoutError()
    return task.result()  # it ended (or failed) on its own while being cancelled


async def _cancel_and_wait(task: asyncio.Future[T]) -> None:
    """Cancel ``task`` and wait for it to end; what it raised is left to the caller (or dropped)."""
    task.cancel()
    task.add_done_callback(retrieve_outcome)
    await asyncio.wait({task})


def retrieve_outcome(task: asyncio.Future[T]) -> None:
    """Mark the outcome of a task nobody reads as read, so asyncio does not log it as lost (a
    done callback)."""
    if not task.cancelled():
        task.exception()
