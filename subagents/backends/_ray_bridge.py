"""Waiting on a ``concurrent.futures.Future`` from anyio, on asyncio or trio alike.

Ray completes an ``ObjectRef.future()`` in a thread of its own, which must never wait for
the event loop (it delivers every completion of the process). So the future's callback
hands ``event.set`` to a waker thread (a deque append under a lock) and returns; the waker
queues one call into the loop for everything queued since its last one, through the
loop's own non-blocking hand-over (asyncio's ``call_soon_threadsafe``, trio's
``run_sync_soon``): a loop that stops or closes with the call queued must not hold the
waker. There is one waker per event loop (an anyio ``RunVar``); it ends after a second
without work and starts again on the next completion, and once its loop has ended it
drops what it was given (nobody is left to wake).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Final, TypeVar

import anyio
from anyio.lowlevel import EventLoopToken, RunVar, current_token

__all__ = ["done_event", "finished", "settled"]

T = TypeVar("T")

logger = logging.getLogger("subagents.backends.ray")

_IDLE: Final = 1.0
"""Seconds a waker waits for work before its thread ends."""


class _Waker:
    """Carries calls into the event loop of ``token`` without making its caller wait."""

    def __init__(self, token: EventLoopToken) -> None:
        self._token = token
        self._cond = threading.Condition()
        self._calls: deque[Callable[[], object]] = deque()
        self._running = False
        self._loop_alive = True

    def send(self, call: Callable[[], object]) -> None:
        """Queue ``call`` for the event loop. Never blocks (a lock held for an append)."""
        with self._cond:
            if not self._loop_alive:
                return
            self._calls.append(call)
            if not self._running:
                self._running = True
                thread = threading.Thread(target=self._run, name="subagents-ray-waker")
                thread.daemon = True  # a loop that ended unawaited must not hang exit
                thread.start()
            elif len(self._calls) == 1:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._calls:
                    self._cond.wait(_IDLE)
                if not self._calls:
                    self._running = False
                    return
                calls = list(self._calls)
                self._calls.clear()
            if not _hand_over(self._token, calls):  # the loop has ended: nobody is left to wake
                with self._cond:
                    self._loop_alive = False
                    self._running = False
                    self._calls.clear()
                return


def _hand_over(token: EventLoopToken, calls: list[Callable[[], object]]) -> bool:
    """Queue ``calls`` into the loop of ``token`` without waiting for it; False once the
    loop has ended (asyncio's ``RuntimeError`` of a closed loop, trio's
    ``RunFinishedError``, a ``RuntimeError`` too)."""
    native = token.native_token
    try:
        if isinstance(native, asyncio.AbstractEventLoop):
            if native.is_closed():
                return False
            native.call_soon_threadsafe(_run_all, calls)
        else:  # trio's TrioToken (untyped here: trio is not a dependency)
            run_sync_soon: Callable[..., object] = getattr(native, "run_sync_soon")  # noqa: B009
            run_sync_soon(_run_all, calls)
    except RuntimeError:
        return False
    return True


def _run_all(calls: list[Callable[[], object]]) -> None:
    for call in calls:
        try:
            call()
        except Exception:
            logger.exception("waking a child waiting on Ray failed")


_WAKER: RunVar[_Waker] = RunVar("subagents-ray-waker")


def _waker() -> _Waker:
    waker = _WAKER.get(None)
    if waker is None:
        waker = _Waker(current_token())
        _WAKER.set(waker)
    return waker


def done_event(future: Future[T]) -> anyio.Event:
    """An event of the current loop, set once ``future`` is done."""
    event = anyio.Event()
    if future.done():
        event.set()
        return event
    send = _waker().send
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
