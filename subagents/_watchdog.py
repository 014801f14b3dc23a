"""Watchdog: one task that cancels scopes at their deadlines.

Re-arming a timer per child costs more than a heap entry: the task sleeps until the
earliest deadline and is woken only when an earlier one arrives. Entries of scopes
disarmed before their deadline stay in the heap until they surface (no O(n) removal); the
heap is rebuilt when such stale entries outnumber the live ones, so it stays within a
constant factor of the children actually watched.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Protocol

import anyio
from anyio.abc import TaskGroup

__all__ = ["Cancellable", "Watchdog"]

_SLACK = 64  # stale entries tolerated beyond the live ones before the heap is rebuilt


class Cancellable(Protocol):
    """What the watchdog cancels at a deadline: a cancel scope, or another part's timer
    (the end of a session's seconds budget) whose ``cancel`` acts then and never raises.
    Hashed by identity."""

    def cancel(self) -> None: ...


class Watchdog:
    """Cancels each armed :class:`anyio.CancelScope` (or other :class:`Cancellable`) at its
    deadline (``anyio.current_time`` units), unless it was disarmed first. One task,
    started with :meth:`start`."""

    def __init__(self) -> None:
        self._armed: dict[Cancellable, float] = {}
        self._heap: list[tuple[float, int, Cancellable]] = []
        self._order = itertools.count()  # ties in deadline never compare scopes
        self._wake_at = math.inf  # the task wakes then, or earlier when woken
        self._wake: anyio.Event | None = None

    def __len__(self) -> int:
        """Scopes armed now."""
        return len(self._armed)

    def start(self, tg: TaskGroup) -> None:
        """Start the watchdog task in ``tg`` (it runs until ``tg`` is cancelled)."""
        self._wake = anyio.Event()
        tg.start_soon(self._watch)

    def arm(self, scope: Cancellable, deadline: float) -> None:
        """Cancel ``scope`` at ``deadline``; arming it again replaces its deadline. O(log n)."""
        self._armed[scope] = deadline
        heapq.heappush(self._heap, (deadline, next(self._order), scope))
        if len(self._heap) > 2 * len(self._armed) + _SLACK:
            self._rebuild()
        if deadline < self._wake_at:
            self._wake_at = deadline
            if self._wake is not None:
                self._wake.set()

    def disarm(self, scope: Cancellable) -> None:
        """Forget ``scope``'s deadline (it ended in time). O(1)."""
        self._armed.pop(scope, None)

    def _rebuild(self) -> None:
        self._heap = [(d, next(self._order), s) for s, d in self._armed.items()]
        heapq.heapify(self._heap)

    def _expire(self, now: float) -> None:
        """Cancel every armed scope whose deadline has passed; drop stale entries."""
        heap, armed = self._heap, self._armed
        while heap and heap[0][0] <= now:
            deadline, _, scope = heapq.heappop(heap)
            if armed.get(scope) == deadline:
                del armed[scope]
                scope.cancel()
        self._wake_at = heap[0][0] if heap else math.inf

    async def _watch(self) -> None:
        while True:
            wake = self._wake = anyio.Event()
            with anyio.CancelScope(deadline=self._wake_at):
                await wake.wait()
            self._expire(anyio.current_time())
