"""Waiting on several children at once: :meth:`SubagentManager.completions` and the
primitives the ``wait_agent`` tool builds on (the tools import them; nothing here knows
the tools).

Everything here reads the manager's per-task record (``SpawnHandle.result`` and ``done``),
never only the mailbox, so a result the mailbox could not hold (full, or dropped) is still
found. Consuming is :meth:`SubagentManager.collect`, done synchronously after the wait,
so a caller cancelled while waiting consumes nothing.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Literal, Protocol

import anyio
import anyio.lowlevel

from ._envelope import DelegateResult
from ._errors import ConfigError
from ._messages import Activity, Message
from ._validators import seconds

if TYPE_CHECKING:
    from ._handle import SpawnHandle
    from ._mailbox import BaseMailbox
    from ._record import ChildRecord
    from ._sessions import Sessions

__all__ = ["Completions", "HostInbox", "WaitMode", "wait_handles"]

WaitMode = Literal["any", "all"]


class HostInbox(Protocol):
    """A host session's inbox as :meth:`Completions.activity` watches it."""

    def peek(self) -> list[Message]: ...
    def waking(self) -> bool: ...
    def watch(self) -> anyio.Event: ...
    def unwatch(self, event: anyio.Event) -> None: ...
    def remote(self) -> bool:
        """Whether messages can come from outside (the session has a remote route)."""
        ...


async def wait_handles(
    handles: Sequence[SpawnHandle], mode: WaitMode, wake: anyio.Event | None = None
) -> None:
    """Block until one (``any``) or every (``all``) handle has ended, or ``wake`` is set.

    An already ended handle counts at once. No timeout: wrap the call in
    ``anyio.move_on_after``. Cancellation leaves every handle untouched.
    """
    pending = [h.done for h in handles if h.result is None]
    if not pending or (mode == "any" and len(pending) < len(handles)):
        return
    await _wait_events(pending, 1 if mode == "any" else len(pending), wake)


async def _wait_events(events: list[anyio.Event], needed: int, wake: anyio.Event | None) -> None:
    """Block until ``needed`` of ``events`` are set, or ``wake`` is."""
    if wake is not None and wake.is_set():
        return
    async with anyio.create_task_group() as tg:

        async def watch(event: anyio.Event) -> None:
            nonlocal needed
            await event.wait()
            needed -= 1
            if needed <= 0:
                tg.cancel_scope.cancel()

        async def watch_wake(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(watch, event)
        if wake is not None:
            tg.start_soon(watch_wake, wake)


class _SessionSignal:
    """``with _SessionSignal(sessions, sid, running) as wake:`` sets ``wake`` when the
    session starts closing (``close_session`` or the manager's ``aclose``: at once, not
    after its children have settled), when its mailbox is dropped, or, with ``on_put``,
    when any result lands in it."""

    def __init__(
        self, sessions: Sessions, session_id: str, running: bool, *, on_put: bool = False
    ) -> None:
        self._sessions = sessions
        self._session_id = session_id
        self._running = running
        self._on_put = on_put
        self._mailbox: BaseMailbox | None = None
        self._sub: str | None = None
        self._watch: int | None = None
        self.event = anyio.Event()

    def __enter__(self) -> anyio.Event:
        sessions, sid = self._sessions, self._session_id
        if sessions.is_closed(sid) or not self._running:
            self.event.set()
            return self.event
        mailbox = sessions.mailbox(sid)
        if mailbox.closed:
            self.event.set()
            return self.event

        def signal() -> None:
            if self._on_put or mailbox.closed or sessions.is_closed(sid):
                self.event.set()

        self._mailbox = mailbox
        self._sub = mailbox.subscribe_all(signal)
        self._watch = sessions.watch_close(sid, self.event.set)
        return self.event

    def __exit__(self, *exc: object) -> None:
        if self._sub is not None and self._mailbox is not None:
            self._mailbox.unsubscribe(self._sub)
            self._sub = None
        if self._watch is not None:
            self._sessions.unwatch_close(self._session_id, self._watch)
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

    def __init__(
        self,
        sessions: Sessions,
        lend_slot: Callable[[], AbstractAsyncContextManager[None]],
        running: Callable[[], bool],
        session_id: str,
    ) -> None:
        self._sessions = sessions
        self._lend_slot = lend_slot
        self._running = running
        self._session_id = session_id
        self._seen: set[str] = set()

    def _ready(self) -> list[DelegateResult]:
        ready = [
            r.envelope
            for r in self._sessions.listing(self._session_id)
            if r.envelope is not None and not r.collected and r.task_id not in self._seen
        ]
        return sorted(ready, key=lambda e: e.timestamp_ms)

    def _live(self) -> list[ChildRecord]:
        return [r for r in self._sessions.listing(self._session_id) if r.envelope is None]

    def _closed(self) -> bool:
        return self._sessions.is_closed(self._session_id) or not self._running()

    def _signal(self, *, on_put: bool) -> _SessionSignal:
        return _SessionSignal(self._sessions, self._session_id, self._running(), on_put=on_put)

    async def _wait_change(
        self, live: list[ChildRecord], arrival: anyio.Event | None = None
    ) -> None:
        with self._signal(on_put=True) as wake:
            async with self._lend_slot():
                events = [r.done for r in live]
                await _wait_events([*events, arrival] if arrival else events, 1, wake)
        await anyio.lowlevel.checkpoint()  # never spin without yielding

    async def activity(self, inbox: HostInbox, timeout: float | None) -> Activity:
        """What :meth:`SubagentManager.activity` waits for: an ended child not collected
        yet, or a message in the session's inbox (both peeked); empty when neither can
        come (no unfinished child and no message, nor a remote route that could bring
        one, or the session closed) or on timeout."""
        await anyio.lowlevel.checkpoint()
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            while True:
                ready, live = self._ready(), self._live()
                idle = not live and not inbox.remote()
                if ready or inbox.waking() or idle or self._closed():
                    return Activity(results=ready, messages=inbox.peek())
                arrival = inbox.watch()
                try:
                    await self._wait_change(live, arrival)
                finally:
                    inbox.unwatch(arrival)
        return Activity(results=self._ready(), messages=inbox.peek())

    async def wait_for(
        self, handles: Sequence[SpawnHandle], mode: WaitMode = "all", *, timeout: float | None
    ) -> None:
        """Block until one (``any``) or every (``all``) of ``handles`` has ended, the
        session starts closing (or the manager does), or ``timeout`` seconds pass.

        What ``wait_agent`` waits on: a child waiting here lends its slot, and taking it
        back never outlasts ``timeout`` (``None``: no limit; ``0``: no wait). Consumes
        nothing; read ``handle.result`` after.
        Cancellation leaves every handle untouched.
        """
        timeout = seconds("timeout", timeout, none_ok=True, zero_ok=True)
        if mode not in ("any", "all"):
            raise ConfigError("mode", "'any' or 'all'", mode)
        with self._signal(on_put=False) as closed:
            if timeout != 0 and not closed.is_set():
                with anyio.move_on_after(timeout):
                    async with self._lend_slot():
                        await wait_handles(handles, mode, closed)

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
