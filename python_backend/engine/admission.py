"""Admission: the queue of requests waiting for the running batch, and what they may hold.

Owns: the bounded waiting queue (refusing with 429 past ``max_waiting_requests``: no unbounded queue), the
cancellation requests that arrive from other threads, and the KV-cache reservations of admitted
requests. FIFO: the head of the queue waits for room rather than being overtaken.
``hold``/``unhold``/``enqueue``/``request_cancel``/``queued`` may be called from any thread; the rest only from the
engine thread. Imports no torch: the scheduler (``scheduler.py``) builds on it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

from python_backend.engine.request import RequestGroup
from python_backend.protocol.errors import ContractError, overloaded

EARLY_CANCEL_S = 10.0
MAX_EARLY_CANCELS = 1024


class Admission:
    def __init__(self, max_waiting: int, kv_budget_tokens: int) -> None:
        self._max_waiting = max_waiting
        self._kv_budget = kv_budget_tokens
        self._inbox: queue.SimpleQueue[RequestGroup] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued = 0  # inbox + waiting, guarded by _lock
        self._cancel_ids: set[str] = set()  # guarded by _lock
        self._early_cancels: dict[str, float] = {}  # id -> monotonic time asked, guarded by _lock
        self.waiting: deque[RequestGroup] = deque()
        self.reserved = 0  # KV token slots held by admitted requests

    # --- any thread -------------------------------------------------------------------------------
    def hold(self) -> None:
        """Take a waiting place for a request still being prepared (its grammar compiling), so
        that requests in preparation count against ``max_waiting_requests`` too."""
        with self._lock:
            if self._queued >= self._max_waiting:
                raise ContractError(overloaded(self._queued))
            self._queued += 1

    def unhold(self) -> None:
        """Give back a place taken by ``hold`` for a request that never came."""
        with self._lock:
            self._queued -= 1

    def enqueue(self, group: RequestGroup, held: bool = False) -> None:
        """Queue ``group``; ``held``: in the place ``hold`` took for it."""
        if not held:
            self.hold()
        self._inbox.put(group)

    def request_cancel(self, request_id: str, before_arrival: bool = False) -> None:
        """Cancel at the next step; ``before_arrival``: also if the request arrives only later
        (within ``EARLY_CANCEL_S``): a caller's cancel can overtake its request on the way here."""
        with self._lock:
            self._cancel_ids.add(request_id)
            if before_arrival:
                if len(self._early_cancels) >= MAX_EARLY_CANCELS:
                    del self._early_cancels[next(iter(self._early_cancels))]
                self._early_cancels[request_id] = time.monotonic()

    def cancelled_before_arrival(self, request_id: str) -> bool:
        with self._lock:
            asked = self._early_cancels.pop(request_id, None)
        return asked is not None and time.monotonic() - asked < EARLY_CANCEL_S

    @property
    def queued(self) -> int:
        with self._lock:
            return self._queued

    # --- engine thread ----------------------------------------------------------------------------
    def drain(self) -> list[RequestGroup]:
        """Move newly submitted requests to the waiting queue; returns them."""
        arrived: list[RequestGroup] = []
        while True:
            try:
                group = self._inbox.get_nowait()
            except queue.Empty:
                return arrived
            self.waiting.append(group)
            arrived.append(group)

    def take_cancelled(self) -> set[str]:
        with self._lock:
            cancelled, self._cancel_ids = self._cancel_ids, set()
        return cancelled

    def can_admit(self, group: RequestGroup, free_rows: int) -> bool:
        """Room for ``group``: sequence seats and KV budget."""
        return group.candidates <= free_rows and self.reserved + group.reservation <= self._kv_budget

    def admit(self) -> RequestGroup:
        """Take the head of the queue and reserve its KV slots."""
        group = self.waiting.popleft()
        with self._lock:
            self._queued -= 1
        self.reserved += group.reservation
        return group

    def release(self, group: RequestGroup) -> None:
        """A finished request gives its KV reservation back."""
        self.reserved -= group.reservation

    def withdraw(self, group: RequestGroup) -> None:
        """A request leaves, wherever it was: out of the queue, or its reservation released."""
        if any(g is group for g in self.waiting):
            self.waiting.remove(group)
            with self._lock:
                self._queued -= 1
        else:
            self.release(group)
