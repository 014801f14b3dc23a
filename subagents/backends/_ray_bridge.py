"""Waiting on a ``concurrent.futures.Future`` from anyio, on asyncio or trio alike.

Ray completes an ``ObjectRef.future()`` in a thread of its own, which must never wait for
the event loop (it delivers every completion of the process). So the future's callback
queues ``event.set`` on the loop's doorbell (a list append under a lock) and, when no
call to empty it is pending, queues one into the loop through the loop's own non-blocking
hand-over (asyncio's ``call_soon_threadsafe``, trio's ``run_sync_soon``), from Ray's
thread itself: one hand-over for every completion that arrives before the loop gets to
it, no thread of ours in between, and nothing that waits for the loop (a loop that stops
or closes with the call queued holds nobody). There is one doorbell per event loop (an
anyio ``RunVar``); once its loop has ended it drops what it is given (nobody is left to
wake).

A :class:`Waiter` also wakes at each tick of its loop's clock (every :data:`TICK`
seconds), so the driver can check on a call that has not answered: one thread per loop,
while anything waits, rings the doorbell once a tick and wakes every waiter then, so a
call that answers before the tick costs no timer of its own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Final, TypeVar

import anyio
from anyio.lowlevel import EventLoopToken, RunVar, current_token

__all__ = ["TICK", "Waiter", "done_event", "finished", "settled", "waiter"]

T = TypeVar("T")

logger = logging.getLogger("subagents.backends.ray")

TICK: Final = 0.25
"""Seconds between the ticks of a loop's clock, which wake every :class:`Waiter`."""


class _Doorbell:
    """Carries calls into the event loop of ``token`` without making its caller wait."""

    def __init__(self, token: EventLoopToken) -> None:
        self._token = token
        self._lock = threading.Lock()
        self._calls: list[Callable[[], object]] = []
        self._rung = False
        """Whether a call to :meth:`_answer` is queued into the loop."""
        self._loop_alive = True

    def send(self, call: Callable[[], object]) -> bool:
        """Queue ``call`` for the event loop; False once the loop has ended (the call is
        dropped). Never blocks: a lock held for an append, and at most one non-blocking
        hand-over while the loop has not answered."""
        with self._lock:
            if not self._loop_alive:
                return False
            self._calls.append(call)
            if self._rung:
                return True
            self._rung = True
        if not _hand_over(self._token, self._answer):  # the loop has ended
            with self._lock:
                self._loop_alive = False
                self._calls.clear()
            return False
        return True

    def _answer(self) -> None:
        """In the loop: run every call queued so far."""
        with self._lock:
            calls, self._calls = self._calls, []
            self._rung = False
        for call in calls:
            try:
                call()
            except Exception:
                logger.exception("waking a child waiting on Ray failed")


def _hand_over(token: EventLoopToken, call: Callable[[], object]) -> bool:
    """Queue ``call`` into the loop of ``token`` without waiting for it; False once the
    loop has ended (asyncio's ``RuntimeError`` of a closed loop, trio's
    ``RunFinishedError``, a ``RuntimeError`` too)."""
    native = token.native_token
    try:
        if isinstance(native, asyncio.AbstractEventLoop):
            if native.is_closed():
                return False
            native.call_soon_threadsafe(call)
        else:  # trio's TrioToken (untyped here: trio is not a dependency)
            run_sync_soon: Callable[..., object] = getattr(native, "run_sync_soon")  # noqa: B009
            run_sync_soon(call)
    except RuntimeError:
        return False
    return True


_DOORBELL: RunVar[_Doorbell] = RunVar("subagents-ray-doorbell")


def _doorbell() -> _Doorbell:
    doorbell = _DOORBELL.get(None)
    if doorbell is None:
        doorbell = _Doorbell(current_token())
        _DOORBELL.set(doorbell)
    return doorbell


class _Clock:
    """Wakes the loop's waiters every :data:`TICK` seconds, all at once, from one thread
    per event loop that runs while any wait: a wait that also wakes on the clock costs a
    set entry, not a timer of its own (a cancel scope with a deadline per wait is a
    timer to insert and remove in the loop, most of it for a call that answers first)."""

    def __init__(self, doorbell: _Doorbell) -> None:
        self._doorbell = doorbell
        self._waiters: set[Waiter] = set()
        """Touched in the loop only."""
        self._lock = threading.Lock()
        self._running = False
        self._wanted = False
        """Whether a waiter was added since the last tick."""

    def add(self, waiter: Waiter) -> None:
        self._waiters.add(waiter)
        with self._lock:
            self._wanted = True
            if self._running:
                return
            self._running = True
        thread = threading.Thread(target=self._run, name="subagents-ray-clock")
        thread.daemon = True  # a loop that ended unawaited must not hang exit
        thread.start()

    def discard(self, waiter: Waiter) -> None:
        self._waiters.discard(waiter)

    def _run(self) -> None:
        while True:
            time.sleep(TICK)
            with self._lock:
                if not self._wanted:  # nobody waits (each waiter woken adds itself again)
                    self._running = False
                    return
                self._wanted = False
            if not self._doorbell.send(self._tick):  # the loop has ended
                with self._lock:
                    self._running = False
                return

    def _tick(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            waiter.wake()


class Waiter:
    """Waits, again and again, until a future is done or the loop's clock ticks."""

    __slots__ = ("_clock", "_done", "_event")

    def __init__(self, clock: _Clock) -> None:
        self._clock = clock
        self._event = anyio.Event()
        self._done = False

    def wake(self) -> None:
        """The clock's tick: the wait in progress returns."""
        self._event.set()

    def finish(self) -> None:
        """The future is done: every wait returns at once from now on."""
        self._done = True
        self._event.set()

    async def wait(self) -> None:
        """Until the future is done, or the next tick (within :data:`TICK` seconds);
        at once once it is done. Cancellable."""
        if self._done:
            return
        event = self._event
        if not event.is_set():
            self._clock.add(self)
            try:
                await event.wait()
            finally:
                self._clock.discard(self)
        if not self._done:
            self._event = anyio.Event()


_CLOCK: RunVar[_Clock] = RunVar("subagents-ray-clock")


def waiter(future: Future[T]) -> Waiter:
    """A :class:`Waiter` for ``future``, in the current loop."""
    clock = _CLOCK.get(None)
    if clock is None:
        clock = _Clock(_doorbell())
        _CLOCK.set(clock)
    waiting = Waiter(clock)
    if future.done():
        waiting.finish()
    else:
        send = _doorbell().send
        future.add_done_callback(lambda _: send(waiting.finish))
    return waiting


def done_event(future: Future[T]) -> anyio.Event:
    """An event of the current loop, set once ``future`` is done."""
    event = anyio.Event()
    if future.done():
        event.set()
        return event
    send = _doorbell().send
    future.add_done_callback(lambda _: send(event.set))
    return event


async def finished(future: Future[T]) -> None:
    """Wait until ``future`` is done, without blocking the event loop (cancellable)."""
    if not future.done():
        await done_event(future).wait()


async def settled(future: Future[T]) -> T:
    """``future``'s result once it is done (its exception raised), waited for as
    :func:`finished` does."""
    await finished(future)
    return future.result()
