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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal

import anyio
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
    _deadlines: dict[SpawnHandle, float]
    _watch_at: float
    _watch_wake: anyio.Event | None
    _clock: Callable[[], float]
    _checkpoint: Callable[[], Awaitable[None]]
    _new_event: Callable[[], anyio.Event]

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
                            await self._checkpoint()
                            continue
                        lingered = False
                        # _take_slot, _release_slot and _pump's first test inlined: once per
                        # child, a call each is a tenth of what the rest of the loop costs.
                        handle._holds_slot = True
                        active = self._active = self._active + 1
                        if active > self._high_water:
                            self._high_water = active
                        self._busy += 1
                        if self._queued and self._workers == self._busy:
                            self._pump()
                        # Not reset after the run: an ended child neither holds nor lends a
                        # slot, so lend_slot() sees nothing to lend until the next is set.
                        _SLOT_OWNER.set(handle)
                        try:
                            await self._run(handle, scope)
                        finally:
                            self._busy -= 1
                            if handle._holds_slot:
                                handle._holds_slot = False
                                self._active -= 1
                                if self._resumers:
                                    self._wake_resumers()
        finally:
            # The last child's handle: a finished task's context outlives it (until its
            # done callbacks have run).
            _SLOT_OWNER.set(None)
            self._workers -= 1

    def _take_slot(self, handle: SpawnHandle) -> None:
        handle._holds_slot = True
        self._active += 1
        if self._active > self._high_water:
            self._high_water = self._active

    def _release_slot(self, handle: SpawnHandle) -> None:
        handle._holds_slot = False
        self._active -= 1
        self._wake_resumers()

    def _wake_resumers(self) -> None:
        # A parent resuming after lending its slot goes before the queue: its children
        # are done, and finishing it frees the whole subtree.
        while self._resumers and self._active < self._limit:
            resumer, event = self._resumers.popleft()
            self._take_slot(resumer)
            event.set()

    def lend_slot(self) -> AbstractAsyncContextManager[None]:
        """Release the calling child's concurrency slot while the block runs.

        A spawned child that blocks waiting for its own children (or anything slow that
        needs no slot) lends its slot so queued children can run: with a limit of 1 a
        parent waiting for a child would otherwise deadlock. On exit the child takes a slot
        back, ahead of the queue, waiting (shielded) until one frees. Outside a spawned
        child it does nothing. :meth:`SpawnHandle.wait` and :meth:`wait_result` use it.
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
            if owner._lends == 1 and not owner._holds_slot:
                await self._reacquire(owner)
            owner._lends -= 1
            if owner._lends and owner._holds_slot:
                # A sibling task began waiting while this one waited for the slot: this
                # task runs on the lent slot, like any task whose wait ends before its
                # siblings' (design/core.md).
                self._release_slot(owner)
                if self._state == "running":
                    self._pump()

    async def _reacquire(self, owner: SpawnHandle) -> None:
        if self._active < self._limit and not self._resumers:
            self._take_slot(owner)
            return
        # Cancelled (or timed out) while lending: the cancelled child (the owner, or an
        # execute() delegate running in its task) ends with its subtree anyway, and that
        # subtree may hold every slot (a limit full of its own descendants, which might
        # never end on their own). Cancel it now, so the slot waited for here frees.
        if anyio.current_effective_deadline() == -math.inf:  # this task is being cancelled
            self._cancel_under_cancelled(owner)
        event = self._new_event()
        self._resumers.append((owner, event))
        # Shielded: a child must not run on without a slot, even when it is being
        # cancelled (its cleanup may catch the cancellation and go on).
        with anyio.CancelScope(shield=True):
            await event.wait()

    def _cancel_under_cancelled(self, owner: SpawnHandle) -> None:
        """Cancel the live descendants of every cancelled child in ``owner``'s subtree.

        Called in a task being cancelled. An execute() delegate is cancelled too when the
        cancellation comes from a scope of its caller's around it (a ``move_on_after`` in
        the parent's runner): its own scope is not cancelled then, but it would not be
        cancelled here if its scope were shielded. Only the delegates under ``owner`` that
        run in its tasks can enclose this point (a spawned child runs on a worker of its own).
        """
        pending = [(owner, False, True)]
        while pending:
            handle, doomed, in_tasks = pending.pop()
            scope = handle._scope
            if not doomed and scope is not None:
                doomed = scope.cancel_called or (
                    handle.sync and in_tasks and _cancelled_from_outside(scope)
                )
            live = self._live.get(handle.task_id)
            if live:
                for child in list(live):
                    if doomed:
                        self._cancel(child, "its parent agent ended")
                    pending.append((child, doomed, in_tasks and child.sync))

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
                self._watch_wake = self._new_event()
                _start_unowned(tg, self._watchdog)
            else:
                self._watch_wake.set()

    async def _watchdog(self) -> None:
        """Cancel every watched child still running at its deadline (status: timeout)."""
        while True:
            wake = self._watch_wake = self._new_event()
            with anyio.CancelScope(deadline=self._watch_at):
                await wake.wait()
            now = self._clock()
            earliest = math.inf
            for handle, deadline in list(self._deadlines.items()):
                if deadline <= now:
                    del self._deadlines[handle]
                    if handle._scope is not None:
                        handle._scope.cancel()
                elif deadline < earliest:
                    earliest = deadline
            self._watch_at = earliest


def _cancelled_from_outside(scope: anyio.CancelScope) -> bool:
    """Whether the current task, which is being cancelled, is cancelled from outside
    ``scope``: it would not be cancelled here were ``scope`` shielded. False for a scope not
    enclosing this point (its shield changes nothing here). The shield is set and restored
    with no checkpoint between, so no task observes it."""
    if scope.shield:
        return False
    scope.shield = True
    try:
        return anyio.current_effective_deadline() != -math.inf
    finally:
        scope.shield = False
