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
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeAlias, TypeVar

import anyio
from anyio.lowlevel import EventLoopToken, RunVar, current_token

__all__ = ["Send", "doorbell", "done_event", "finished", "settled", "when_done"]

T = TypeVar("T")

logger = logging.getLogger("subagents.backends.ray")


class _Doorbell:
    """Carries calls into the event loop of ``token`` without making its caller wait."""

    def __init__(self, token: EventLoopToken) -> None:
        self._token = token
        self._lock = threading.Lock()
        self._calls: list[Callable[[], object]] = []
        self._rung = False
        """Whether a call to :meth:`_answer` is queued into the loop."""
        self._loop_alive = True

    def send(self, call: Callable[[], object]) -> None:
        """Queue ``call`` for the event loop. Never blocks: a lock held for an append,
        and at most one non-blocking hand-over while the loop has not answered."""
        with self._lock:
            if self._loop_alive and self._rung and _closed(self._token):
                # An asyncio loop that closed with the answer queued never runs it.
                self._loop_alive = False
                self._calls.clear()
            if not self._loop_alive:
                return
            self._calls.append(call)
            if self._rung:
                return
            self._rung = True
        if not _hand_over(self._token, self._answer):  # the loop has ended
            with self._lock:
                self._loop_alive = False
                self._calls.clear()

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


def _closed(token: EventLoopToken) -> bool:
    """Whether the loop of ``token`` is an asyncio loop that has closed (a trio run that
    ends runs what was queued into it, or refuses the hand-over)."""
    native = token.native_token
    return isinstance(native, asyncio.AbstractEventLoop) and native.is_closed()


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


Send: TypeAlias = "Callable[[Callable[[], object]], None]"
"""An event loop's way in: ``send(call)`` runs ``call`` in that loop, from any thread,
without waiting for it (dropped once the loop has ended)."""


def doorbell() -> Send:
    """The current event loop's :data:`Send`, to keep for use outside its tasks (a
    callback the loop runs is not in a task, and anyio cannot tell its loop there)."""
    return _doorbell().send


def when_done(future: Future[T], call: Callable[[Future[T]], object], into: Send) -> None:
    """Run ``call(future)`` in the loop of ``into`` once ``future`` is done (at once, if
    it is)."""
    if future.done():
        call(future)
        return
    future.add_done_callback(lambda done: into(lambda: call(done)))


def done_event(future: Future[T]) -> anyio.Event:
    """An event of the current loop, set once ``future`` is done."""
    event = anyio.Event()
    when_done(future, lambda _: event.set(), doorbell())
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
