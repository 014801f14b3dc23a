"""The event loop's clock, checkpoint and event type, looked up once per manager run: the
asyncio (and trio) adapter.

:func:`anyio.current_time`, :func:`anyio.lowlevel.checkpoint` and :class:`anyio.Event` find
the running backend on every call (sniffio, then the backend class): for a no-op child that
lookup costs more than the work. What is returned here is exactly what anyio's backends
use: the running loop's ``time()`` on asyncio and ``trio.current_time()`` on trio (which
follows a ``MockClock``), so every deadline stays in :func:`anyio.current_time` units;
``asyncio.sleep(0)`` and ``trio.lowlevel.checkpoint``, which anyio's checkpoint awaits; and
the backend's own :class:`anyio.Event` subclass. The only module that names an event loop.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable
from typing import cast

import anyio
import anyio.lowlevel

__all__ = ["loop_checkpoint", "loop_clock", "loop_event"]


def loop_clock() -> Callable[[], float]:
    """The running event loop's clock function (call from inside the loop).

    Used only if it agrees with :func:`anyio.current_time` now (to a millisecond): a wrong
    guess (trio's clocks carry an offset of hours from asyncio's) falls back to anyio's.
    """
    clock = _guess()
    if clock is not anyio.current_time and abs(clock() - anyio.current_time()) > 0.001:
        return anyio.current_time  # pragma: no cover - a backend we guessed wrong
    return clock


def loop_checkpoint() -> Callable[[], Awaitable[None]]:
    """What :func:`anyio.lowlevel.checkpoint` awaits on the running backend (call from
    inside the loop): a cancellation check and a pass through the scheduler."""
    if _in_trio():
        return cast("Callable[[], Awaitable[None]]", sys.modules["trio"].lowlevel.checkpoint)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # another backend: ask anyio each time
        return anyio.lowlevel.checkpoint
    return functools.partial(asyncio.sleep, 0)


def loop_event() -> Callable[[], anyio.Event]:
    """The running backend's :class:`anyio.Event` class (call from inside the loop): its
    instances are ordinary anyio events, built without the per-call backend lookup."""
    event_class = type(anyio.Event())
    if not issubclass(event_class, anyio.Event):  # pragma: no cover - anyio changed
        return anyio.Event
    return event_class


def _in_trio() -> bool:
    trio = sys.modules.get("trio")  # not imported: not running under trio
    return trio is not None and bool(trio.lowlevel.in_trio_run())


def _guess() -> Callable[[], float]:
    if _in_trio():
        return cast("Callable[[], float]", sys.modules["trio"].current_time)
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:  # another backend: ask anyio each time
        return anyio.current_time
