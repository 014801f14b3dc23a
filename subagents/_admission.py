"""Admission: the FIFO of queued spawns, the worker pool, the slot counter, slot lending
and the shared watchdog. A mixin of :class:`~subagents.SubagentManager`.

A queued spawn is a :class:`SpawnHandle` in a deque, not a task. Workers (tasks in the
manager's task group) take the next handle while a slot is free and run it in place; a
spawn creates a task only when the pool is short. One counter is the limiter, so resizing
it can never let two limiters admit at once. A child blocked on its own children lends its
slot (``lend_slot``) so nested trees cannot deadlock at low limits.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from ._handle import NO_LEND, QUEUED, SpawnHandle

__all__ = ["Admission"]

# The spawned child whose slot the current task runs on (None outside worker runs).
_SLOT_OWNER: ContextVar[SpawnHandle | None] = ContextVar("subagents_slot_owner", default=None)


def _start_unowned(tg: TaskGroup, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``tg.start_soon(func)`` from a context with no slot owner.

    It may be called inside a child's run (a spawn or a lend in a runner, the first
    deadline). A task copies the context it is started from, and anyio keeps another copy
    for the task's done callback, for as long as the task lives: a long-lived worker or the
    watchdog would keep that child's handle alive long after its record was forgotten.
    """
    if _SLOT_OWNER.get() is None:
        tg.start_soon(func)
        return
    token = _SLOT_OWNER.set(None)
    try:
        tg.start_soon(func)
    finally:
        _SLOT_OWNER.reset(token)


class Admission:
    """Worker pool and slot accounting; state lives on the manager (set in its __init__)."""

    _tg: TaskGroup | None
    _state: Literal["new", "running", "closing", "closed"]
    _queue: deque[SpawnHandle]
    _queued: int
    _active: int
    _workers: int
    _busy: int
    _limit: int
    _high_water: int
    _resumers: deque[tuple[SpawnHandle, anyio.Event]]
    _borrows: int
    _borrowers: dict[SpawnHandle, None]
    _deadlines: dict[SpawnHandle, float]
    _watch_at: float
    _watch_wake: anyio.Event | None

    _live: dict[str, dict[SpawnHandle, None]]

    if TYPE_CHECKING:

        def _cancel(self, handle: SpawnHandle, reason: str = ...) -> bool: ...

        async def _run(
            self, handle: SpawnHandle, worker_scope: anyio.CancelScope | None = None
        ) -> None: ...

    def _pump(self) -> None:
        """Start a worker if children are queued, none is idle and a slot is free.

        Workers start one at a time: each, on taking a child, calls this again, so a
        worker whose children never block drains the queue alone instead of leaving a
        thousand freshly started workers to find it empty.
        """
        tg = self._tg
        assert tg is not None
        # An idle (or starting) worker will take the next queued child and a slot.
        if self._queued and self._workers == self._busy and self._active < self._limit:
            self._workers += 1
            _start_unowned(tg, self._worker)

    async def _worker(self) -> None:
        try:
            while self._active < self._limit:
                # One cancel scope serves child after child (entering a scope per child
                # costs more than the rest of a no-op child); a child that was cancelled
                # or timed out leaves it cancelled for good, so the next one gets a new one.
                with anyio.CancelScope() as scope:
                    lingered = False
                    while self._active < self._limit and not scope.cancel_called:
                        handle = self._next_queued()
                        if handle is None:
                            if lingered:
                                return
                            # Queue empty: let the waiters this child woke run first (their
                            # wake is not delayed by this worker's exit) and take what they
                            # spawn next instead of a new worker being started for it.
                            lingered = True
                            await anyio.lowlevel.checkpoint()
                            continue
                        lingered = False
                        self._take_slot(handle)
                        self._busy += 1
                        self._pump()  # this worker is busy now: another may be needed
                        # Not reset after the run: an ended child neither holds nor lends a
                        # slot, so lend_slot() sees nothing to lend until the next is set.
                        _SLOT_OWNER.set(handle)
                        try:
                            await self._run(handle, scope)
                        finally:
                            self._busy -= 1
                            if handle._holds_slot:
                                self._release_slot(handle)
        finally:
            # The last child's handle: a finished task's context outlives it (until its
            # done callbacks have run).
            _SLOT_OWNER.set(None)
            self._workers -= 1

    def _take_slot(self, handle: SpawnHandle) -> None:
        handle._holds_slot = True
        self._active += 1
        held = self._active - len(self._borrowers)
        if held > self._high_water:
            self._high_water = held

    def _borrow_slot(self, handle: SpawnHandle) -> None:
        """Let ``handle`` run on with no free slot: its lend ended (timed out, cancelled)
        while waiting for one. It counts against the limit like a held slot, so nobody is
        admitted until the overdraft is repaid by the next slots to free."""
        handle._holds_slot = True
        self._active += 1
        self._borrows += 1
        self._borrowers[handle] = None

    def _release_slot(self, handle: SpawnHandle) -> None:
        handle._holds_slot = False
        self._active -= 1
        borrowers = self._borrowers
        if borrowers:
            borrowers.pop(handle, None)
        if self._resumers or borrowers:
            self._slot_freed()

    def _slot_freed(self) -> None:
        """Hand out capacity that just freed (a release, or a raised limit).

        A borrowed slot is repaid first: the oldest borrower becomes a regular holder, so
        the number of borrowers is always exactly how far the children running exceed the
        limit. Then parents resuming after lending their slot go before the queue: their
        children are done, and finishing them frees whole subtrees.
        """
        borrowers = self._borrowers
        while borrowers and self._active - len(borrowers) < self._limit:
            del borrowers[next(iter(borrowers))]
        while self._resumers and self._active < self._limit:
            resumer, event = self._resumers.popleft()
            self._take_slot(resumer)
            event.set()

    def lend_slot(self) -> AbstractAsyncContextManager[None]:
        """Release the calling child's concurrency slot while the block runs.

        A spawned child that blocks waiting for its own children (or anything slow that
        needs no slot) lends its slot so queued children can run: with a limit of 1 a
        parent waiting for a child would otherwise deadlock. On exit the child takes a slot
        back, ahead of the queue. If none is free it waits for one, but that wait never
        outlasts the block's own deadline or cancellation: then the child runs on at once
        on a *borrowed* slot (``statistics().borrowed``), which counts against the limit
        and is repaid by the next slot to free, before anyone queued is admitted. Outside
        a spawned child it does nothing. Every blocking wait of the library that a child
        can reach (:meth:`SpawnHandle.wait`, :meth:`wait_result`, the mailbox's ``wait``,
        ``wait_agent``, :meth:`completions`) uses it.
        """
        owner = _SLOT_OWNER.get()
        if owner is None or (owner._lends == 0 and not owner._holds_slot):
            return NO_LEND  # the common wait of a root parent: no generator machinery
        return self._lend(owner)

    @asynccontextmanager
    async def _lend(self, owner: SpawnHandle) -> AsyncIterator[None]:
        # ``_lends`` counts the owner's tasks inside a lend, the last one out included while
        # it waits for a slot: a sibling task's wait starting meanwhile must lend the slot
        # that one is taking back (else the owner resumes holding it while that wait's
        # children queue behind it). Outside these transitions ``_lends > 0`` implies the
        # owner holds no slot.
        owner._lends += 1
        if owner._holds_slot:
            self._release_slot(owner)
            if self._state == "running":
                self._pump()
        try:
            yield
        finally:
            # Only the last task out takes the slot back, and only while the child still
            # runs: a task that outlived its runner (started in the background) must not
            # take a slot for a child whose worker is gone.
            reacquiring = owner._lends == 1 and not owner._holds_slot and not owner._ending
            try:
                if reacquiring:
                    await self._reacquire(owner)
            finally:
                owner._lends -= 1
                if reacquiring and owner._lends and owner._holds_slot:
                    # A sibling task began waiting while this one waited for the slot: this
                    # task runs on the lent slot, like any task whose wait ends before its
                    # siblings' (design/core.md). The sibling's own exit takes it back.
                    self._release_slot(owner)
                    if self._state == "running":
                        self._pump()

    async def _reacquire(self, owner: SpawnHandle) -> None:
        if self._active < self._limit and not self._resumers:
            self._take_slot(owner)
            return
        entry = (owner, anyio.Event())
        self._resumers.append(entry)
        try:
            await entry[1].wait()
        except BaseException:
            # The wait's deadline passed or the child is being cancelled: a timed wait must
            # return on time, and a cancelled child must reach its envelope, so it runs on
            # a borrowed slot rather than wait (its cleanup may catch the cancellation).
            if not owner._holds_slot:  # not handed a slot at the last moment
                self._resumers.remove(entry)
                self._borrow_slot(owner)
            raise

    def _next_queued(self) -> SpawnHandle | None:
        queue = self._queue
        while queue:
            handle = queue.popleft()
            if handle.state == QUEUED:
                self._queued -= 1
                return handle
        return None

    def _watch(self, handle: SpawnHandle, deadline: float) -> None:
        """Put a child running on a worker under the one shared watchdog task.

        Re-arming a timer per child costs more than a dict entry: the watchdog sleeps until
        the earliest deadline it may hold and is woken only when an earlier one arrives.
        """
        self._deadlines[handle] = deadline  # (_run does this itself for a later deadline)
        if deadline < self._watch_at:
            self._watch_at = deadline
            if self._watch_wake is None:
                tg = self._tg
                assert tg is not None
                self._watch_wake = anyio.Event()
                _start_unowned(tg, self._watchdog)
            else:
                self._watch_wake.set()

    async def _watchdog(self) -> None:
        """Cancel every watched child still running at its deadline (status: timeout)."""
        while True:
            wake = self._watch_wake = anyio.Event()
            with anyio.CancelScope(deadline=self._watch_at):
                await wake.wait()
            now = anyio.current_time()
            earliest = math.inf
            for handle, deadline in list(self._deadlines.items()):
                if deadline <= now:
                    del self._deadlines[handle]
                    if handle._scope is not None:
                        handle._scope.cancel()
                elif deadline < earliest:
                    earliest = deadline
            self._watch_at = earliest
