"""Waiting on several children at once: :meth:`SubagentManager.completions` and the
primitives the ``wait_agent`` tool builds on (the tools import them; nothing here knows
the tools).

Everything here reads the manager's per-task record (``SpawnHandle.result`` and ``done``),
never only the mailbox, so a result the mailbox could not hold (full, or dropped) is still
found. Consuming is :meth:`SubagentManager.collect`, done synchronously after the wait,
so a caller cancelled while waiting consumes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Sequence
from typing import TYPE_CHECKING, Literal

import anyio

from ._envelope import DelegateResult

if TYPE_CHECKING:
    from ._handle import SpawnHandle
    from ._manager import SubagentManager

__all__ = ["Completions", "WaitMode", "session_signal", "wait_handles"]

WaitMode = Literal["any", "all"]


async def wait_handles(
    handles: Sequence[SpawnHandle], mode: WaitMode, wake: anyio.Event | None = None
) -> None:
    """Block until one (``any``) or every (``all``) handle has ended, or ``wake`` is set.

    An already ended handle counts at once. No timeout: wrap the call in
    ``anyio.move_on_after``. Cancellation leaves every handle untouched.
    """
    pending = [h for h in handles if h.result is None]
    if not pending or (mode == "any" and len(pending) < len(handles)):
        return
    if wake is not None and wake.is_set():
        return
    needed = 1 if mode == "any" else len(pending)
    async with anyio.create_task_group() as tg:

        async def watch(handle: SpawnHandle) -> None:
            nonlocal needed
            await handle.done.wait()
            needed -= 1
            if needed <= 0:
                tg.cancel_scope.cancel()

        async def watch_wake(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for handle in pending:
            tg.start_soon(watch, handle)
        if wake is not None:
            tg.start_soon(watch_wake, wake)


class session_signal:
    """``with session_signal(manager, sid) as wake:`` sets ``wake`` when the session starts
    closing (``close_session`` or the manager's ``aclose``: at once, not after its children
    have settled), when its mailbox is dropped, or, with ``on_put``, when any result lands
    in it."""

    def __init__(self, manager: SubagentManager, session_id: str, *, on_put: bool = False):
        self._manager = manager
        self._session_id = session_id
        self._on_put = on_put
        self._sub: str | None = None
        self._watch: int | None = None
        self.event = anyio.Event()

    def __enter__(self) -> anyio.Event:
        manager, sid = self._manager, self._session_id
        if manager.session_closed(sid) or not manager.running:
            self.event.set()
            return self.event
        mailbox = manager.mailbox(sid)
        if mailbox.closed:
            self.event.set()
            return self.event

        def signal() -> None:
            if self._on_put or mailbox.closed or manager.session_closed(sid):
                self.event.set()

        self._mailbox = mailbox
        self._sub = mailbox.subscribe_all(signal)
        self._watch = manager._watch_close(sid, self.event.set)
        return self.event

    def __exit__(self, *exc: object) -> None:
        if self._sub is not None:
            self._mailbox.unsubscribe(self._sub)
            self._sub = None
        if self._watch is not None:
            self._manager._unwatch_close(self._session_id, self._watch)
            self._watch = None


class Completions:
    """Wakes an idle host loop when children of a session end, without consuming results.

    Returned by :meth:`SubagentManager.completions`. Two ways to use it:

    * ``ready = await manager.completions(sid)``: blocks until at least one child of the
      session has ended with a result nobody collected yet, and returns those envelopes
      (peeked, not consumed: ``wait_agent`` still collects them). Returns ``[]`` at once
      only when there is no such envelope and no unfinished child, or the session is
      closed, so it never hangs forever. Level-triggered: a child that ended before the
      call counts, so no completion is missed between turns, and it counts on every call
      until its result is collected: a loop that reports the envelopes itself collects
      them, or it is woken for the same ones again.
    * ``async for envelope in manager.completions(sid)``: yields each uncollected
      envelope once, in completion order, until no child of the session is unfinished
      (or the session is closed). ``async with manager.completions(sid) as c:`` works too.

    Cancellation: cancelling the waiter consumes and changes nothing.
    """

    def __init__(self, manager: SubagentManager, session_id: str) -> None:
        self._manager = manager
        self._session_id = session_id
        self._seen: set[str] = set()

    def _ready(self) -> list[DelegateResult]:
        ready = [
            h.result
            for h in self._manager.tasks(self._session_id)
            if h.result is not None and not h.collected and h.task_id not in self._seen
        ]
        return sorted(ready, key=lambda e: e.timestamp_ms)

    def _live(self) -> list[SpawnHandle]:
        return [h for h in self._manager.tasks(self._session_id) if h.result is None]

    def _closed(self) -> bool:
        manager = self._manager
        return manager.session_closed(self._session_id) or not manager.running

    async def _wait_change(self, live: list[SpawnHandle]) -> None:
        with session_signal(self._manager, self._session_id, on_put=True) as wake:
            async with self._manager.lend_slot():
                await wait_handles(live, "any", wake)
        await anyio.lowlevel.checkpoint()  # never spin without yielding

    async def wait(self) -> list[DelegateResult]:
        """See the class docstring (the awaitable form). Blocks; never consumes."""
        # A checkpoint even when something is ready at once: a host loop that calls this
        # every turn must still let the children (and its own timeouts) run.
        await anyio.lowlevel.checkpoint()
        while True:
            ready = self._ready()
            if ready:
                return ready
            live = self._live()
            if not live or self._closed():
                return []
            await self._wait_change(live)

    def __await__(self) -> Generator[object, None, list[DelegateResult]]:
        return self.wait().__await__()

    async def __aenter__(self) -> Completions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __aiter__(self) -> AsyncIterator[DelegateResult]:
        return self

    async def __anext__(self) -> DelegateResult:
        while True:
            ready = self._ready()
            if ready:
                self._seen.add(ready[0].task_id)
                return ready[0]
            live = self._live()
            if not live or self._closed():
                raise StopAsyncIteration
            await self._wait_change(live)
