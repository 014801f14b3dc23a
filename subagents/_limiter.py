"""SpawnLimiter: the FIFO of queued spawns, the worker pool, the slots and slot lending.

A queued spawn is a record in a deque, not a task. Workers (tasks in the manager's task
group) take the next record while a slot is free and run it in place; a spawn creates a
task only when the pool is short. One counter is the limiter, so resizing it can never
let two limiters admit at once. A child blocked on its own children lends its slot
(:meth:`SpawnLimiter.lend_slot`) so nested trees cannot deadlock at low limits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from ._record import NO_LEND, QUEUED, ChildRecord
from ._validators import count

__all__ = ["RunChild", "SpawnLimiter", "start_unowned"]

RunChild = Callable[[ChildRecord, anyio.CancelScope], Awaitable[None]]
"""``run(record, scope)``: runs one child to its envelope under the worker's scope."""

_YIELD_EVERY = 16
"""Journaled children a worker runs in a row before it yields to the event loop."""

# The spawned child whose slot the current task runs on (None outside worker runs).
_SLOT_OWNER: ContextVar[tuple[SpawnLimiter, ChildRecord] | None] = ContextVar(
    "subagents_slot_owner", default=None
)


def start_unowned(tg: TaskGroup, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``tg.start_soon(func)`` from a context with no slot owner.

    It may be called inside a child's run (a spawn or a lend in a runner). A task copies
    the context it is started from, and anyio keeps another copy for the task's done
    callback, for as long as the task lives: a long-lived worker would keep that child's
    record alive long after it was forgotten.
    """
    if _SLOT_OWNER.get() is None:
        tg.start_soon(func)
        return
    token = _SLOT_OWNER.set(None)
    try:
        tg.start_soon(func)
    finally:
        _SLOT_OWNER.reset(token)


class SpawnLimiter:
    """Admits queued spawns, oldest first, while fewer than ``limit`` slots are held.

    Args:
        limit: slots (>= 1); changeable with :meth:`set_limit`.
    """

    def __init__(self, limit: int) -> None:
        self._limit = count("max_concurrent_spawns", limit, minimum=1)
        self._run: RunChild | None = None
        self._tg: TaskGroup | None = None
        self._open = False
        self._queue: deque[ChildRecord] = deque()
        self._queued = 0
        self._active = 0  # slots held, borrowed ones included
        self._workers = 0
        self._busy = 0  # workers inside a child run (holding or lending a slot)
        self._high_water = 0
        self._borrows = 0
        # Children on a borrowed slot (counted in active too), oldest first: repaid first.
        self._borrowers: dict[ChildRecord, None] = {}
        self._resumers: deque[tuple[ChildRecord, anyio.Event]] = deque()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def queued(self) -> int:
        """Spawns waiting for a slot."""
        return self._queued

    @property
    def active(self) -> int:
        """Slots held now, borrowed ones included."""
        return self._active

    @property
    def workers(self) -> int:
        """Worker tasks alive."""
        return self._workers

    @property
    def high_water(self) -> int:
        """Most slots held at once, borrowed ones not counted."""
        return self._high_water

    @property
    def borrows(self) -> int:
        """Times a child ran on a borrowed slot."""
        return self._borrows

    @property
    def resuming(self) -> int:
        """Children waiting to take back a slot they lent."""
        return len(self._resumers)

    @property
    def borrowed(self) -> int:
        """Slots in use beyond the limit now."""
        return len(self._borrowers)

    def start(self, tg: TaskGroup, run: RunChild) -> None:
        """Start admitting: workers in ``tg`` run each admitted child with ``run``."""
        self._tg = tg
        self._run = run
        self._open = True
        self._pump()

    def stop(self) -> None:
        """Admit nobody more (the owner is closing); queued spawns stay queued."""
        self._open = False

    def set_limit(self, value: int) -> None:
        """Change the limit. Raising it admits at once (borrowed slots are repaid first,
        then resuming parents go ahead of the queue); lowering it lets running children
        finish and admits nobody until below the new limit."""
        self._limit = count("max_concurrent_spawns", value, minimum=1)
        self._slot_freed()
        self._pump()

    def submit(self, record: ChildRecord) -> None:
        """Queue a spawned child; it starts when a slot frees, in FIFO order. O(1)."""
        free = self._limit - self._active
        ahead = self._queued
        record.queue_position = 0 if ahead < free else ahead - free + 1
        self._queue.append(record)
        self._queued += 1
        if self._workers == self._busy:  # no idle worker will take it: _pump decides
            self._pump()

    def withdraw(self, record: ChildRecord) -> None:
        """A queued child left the queue (cancelled): it is skipped when reached."""
        if record.state == QUEUED:
            self._queued -= 1

    def give_up_slot(self, record: ChildRecord) -> None:
        """A child whose runner is over gives its slot up for good (while it settles)."""
        if record.holds_slot:
            self._release_slot(record)
            self._pump()

    def _pump(self) -> None:
        """Start a worker if children are queued, none is idle and a slot is free.

        Workers start one at a time: each, on taking a child, calls this again, so a
        worker whose children never block drains the queue alone instead of leaving a
        thousand freshly started workers to find it empty.
        """
        if (
            self._open
            and self._queued
            and self._workers == self._busy
            and self._active < self._limit
        ):
            assert self._tg is not None
            self._workers += 1
            start_unowned(self._tg, self._worker)

    async def _worker(self) -> None:
        try:
            while self._active < self._limit:
                # One cancel scope serves child after child (entering a scope per child
                # costs more than the rest of a no-op child); a child that was cancelled
                # or timed out leaves it cancelled for good, so the next one gets a new one.
                with anyio.CancelScope() as scope:
                    if not await self._run_while_free(scope):
                        return
        finally:
            # The last child's record: a finished task's context outlives it (until its
            # done callbacks have run).
            _SLOT_OWNER.set(None)
            self._workers -= 1

    async def _run_while_free(self, scope: anyio.CancelScope) -> bool:
        """Run queued children under ``scope`` until it is cancelled (True: go on with a
        new scope) or the queue stays empty (False: the worker exits)."""
        lingered = False
        unyielded = 0  # journaled children run since this worker last yielded
        while self._active < self._limit and not scope.cancel_called:
            record = self._next_queued()
            if record is None:
                if lingered:
                    return False
                # Queue empty: let the waiters this child woke run first (their wake is
                # not delayed by this worker's exit) and take what they spawn next
                # instead of a new worker being started for it.
                lingered = True
                await anyio.lowlevel.checkpoint()
                continue
            lingered = False
            self._take_slot(record)
            self._busy += 1
            self._pump()  # this worker is busy now: another may be needed
            # Not reset after the run: an ended child neither holds nor lends a slot, so
            # lend_slot() sees nothing to lend until the next is set.
            _SLOT_OWNER.set((self, record))
            assert self._run is not None
            try:
                await self._run(record, scope)
            finally:
                self._busy -= 1
                if record.holds_slot:
                    self._release_slot(record)
            if record.journaled:
                # A store's commits reach the event loop as callbacks, which never run
                # while a worker runs no-op children back to back; their envelopes would
                # wait for the whole queue.
                unyielded += 1
                if unyielded == _YIELD_EVERY:
                    unyielded = 0
                    await anyio.lowlevel.checkpoint()
        return True

    def _next_queued(self) -> ChildRecord | None:
        queue = self._queue
        while queue:
            record = queue.popleft()
            if record.state == QUEUED:
                self._queued -= 1
                return record
        return None

    def _take_slot(self, record: ChildRecord) -> None:
        record.holds_slot = True
        self._active += 1
        held = self._active - len(self._borrowers)
        if held > self._high_water:
            self._high_water = held

    def _borrow_slot(self, record: ChildRecord) -> None:
        """Let ``record`` run on with no free slot: its lend ended (timed out, cancelled)
        while waiting for one. It counts against the limit like a held slot, so nobody is
        admitted until the overdraft is repaid by the next slots to free."""
        record.holds_slot = True
        self._active += 1
        self._borrows += 1
        self._borrowers[record] = None

    def _release_slot(self, record: ChildRecord) -> None:
        record.holds_slot = False
        self._active -= 1
        borrowers = self._borrowers
        if borrowers:
            borrowers.pop(record, None)
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

    def resumes(self, record: ChildRecord) -> bool:
        """Whether ``record``, waiting with its slot lent, would take it back at once."""
        lending = record.lends > 0 and not record.holds_slot
        return not lending or (self._active < self._limit and not self._resumers)

    def lend_slot(self) -> AbstractAsyncContextManager[None]:
        """Release the calling child's slot while the block runs; see
        :meth:`SubagentManager.lend_slot`. Outside a spawned child it does nothing."""
        slot = _SLOT_OWNER.get()
        if slot is None or slot[0] is not self:
            return NO_LEND  # a root parent, or a child of another manager
        owner = slot[1]
        if owner.lends == 0 and not owner.holds_slot:
            return NO_LEND  # the common wait of a root parent: no generator machinery
        return self._lend(owner)

    @asynccontextmanager
    async def _lend(self, owner: ChildRecord) -> AsyncIterator[None]:
        # ``lends`` counts the owner's tasks inside a lend, the last one out included while
        # it waits for a slot: a sibling task's wait starting meanwhile must lend the slot
        # that one is taking back (else the owner resumes holding it while that wait's
        # children queue behind it). Outside these transitions ``lends > 0`` implies the
        # owner holds no slot.
        owner.lends += 1
        if owner.holds_slot:
            self._release_slot(owner)
            self._pump()
        try:
            yield
        finally:
            # Only the last task out takes the slot back, and only while the child still
            # runs: a task that outlived its runner (started in the background) must not
            # take a slot for a child whose worker is gone.
            reacquiring = owner.lends == 1 and not owner.holds_slot and not owner.ending
            try:
                if reacquiring:
                    await self._reacquire(owner)
            finally:
                owner.lends -= 1
                if reacquiring and owner.lends and owner.holds_slot:
                    # A sibling task began waiting while this one waited for the slot: this
                    # task runs on the lent slot, like any task whose wait ends before its
                    # siblings' (design/core.md). The sibling's own exit takes it back.
                    self._release_slot(owner)
                    self._pump()

    async def _reacquire(self, owner: ChildRecord) -> None:
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
            if not owner.holds_slot:  # not handed a slot at the last moment
                self._resumers.remove(entry)
                self._borrow_slot(owner)
            raise
