"""The courier: calls into the event loop, in order, for a thread that must not wait for them.

``anyio.from_thread.run_sync`` blocks its thread until the event loop has run the call.
The writer thread would then open its next transaction only once the loop had run the
last one's callbacks, so the two threads would take turns instead of overlapping (and a
loop busy running children back to back would stall every commit). So the writer hands
its calls to this thread (:meth:`Courier.send`, a deque append under a lock) and goes on
committing; the courier makes one blocking call into the loop for everything queued
since its last one.

Calls run on the loop in the order they were sent, each alone: one that raises is logged
and does not keep the rest from running. Once the event loop has ended (a store never
closed), calls are dropped, and ``on_lost`` tells the writer not to wait for them.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

import anyio.from_thread
from anyio.lowlevel import EventLoopToken

__all__ = ["Courier"]

logger = logging.getLogger("subagents.store")

_Call = tuple[Callable[..., object], tuple[object, ...]]


class Courier:
    """One thread that carries calls to the event loop of ``token``."""

    def __init__(self, token: EventLoopToken, *, name: str, on_lost: Callable[[], object]) -> None:
        self._token = token
        self._on_lost = on_lost  # called in this thread once calls stop reaching the loop
        self._cond = threading.Condition()
        self._calls: deque[_Call] = deque()
        self._stopping = False
        self._loop_alive = True
        self.trips = 0
        """Calls into the event loop so far (each carrying every call queued by then)."""
        self._thread = threading.Thread(target=self._run, name=name)
        self._thread.daemon = True  # an unclosed store must not hang interpreter exit

    def start(self) -> None:
        self._thread.start()

    def send(self, fn: Callable[..., object], *args: object) -> None:
        """Queue ``fn(*args)`` for the event loop. Never blocks (a lock held for an append)."""
        with self._cond:
            if not self._loop_alive:
                return
            self._calls.append((fn, args))
            if len(self._calls) == 1:
                self._cond.notify()

    @property
    def carrying(self) -> bool:
        """Calls are waiting for this thread to carry them (read without the lock: a
        hint)."""
        return bool(self._calls)

    @property
    def reaches_loop(self) -> bool:
        """False once the event loop has ended: what is sent from then on is dropped."""
        return self._loop_alive

    def stop(self) -> None:
        """Carry what is queued, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def join(self, timeout: float | None) -> bool:
        """Wait for the thread (blocking); True if it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._calls and not self._stopping:
                    self._cond.wait()
                if not self._calls:
                    return
                calls = list(self._calls)
                self._calls.clear()
            self.trips += 1
            try:
                anyio.from_thread.run_sync(_run_all, calls, token=self._token)
                calls.clear()  # this thread's frame must not keep the last trip's writes
            except anyio.RunFinishedError:  # the event loop has ended: nobody is left to tell
                with self._cond:
                    self._loop_alive = False
                    self._calls.clear()
                self._on_lost()
                return
            except BaseException:  # a bug: say so, and keep carrying
                logger.exception("the store's courier failed to reach the event loop")
                self._on_lost()


def _run_all(calls: list[_Call]) -> None:
    for fn, args in calls:
        try:
            fn(*args)
        except Exception:
            logger.exception("a store callback on the event loop raised")
