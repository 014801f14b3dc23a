"""The event loop's clock, looked up once per manager run: the asyncio (and trio) adapter.

:func:`anyio.current_time` finds the running backend on every call (sniffio, then the
backend class): about three quarters of its cost, paid twice per child. The function
returned here is exactly what anyio's backends call (asyncio: the running loop's
``time()``; trio: ``trio.current_time()``, which follows a ``MockClock``), so every deadline
stays in :func:`anyio.current_time` units. The only module that names an event loop.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import cast

import anyio

__all__ = ["loop_clock"]


def loop_clock() -> Callable[[], float]:
    """The running event loop's clock function (call from inside the loop).

    Used only if it agrees with :func:`anyio.current_time` now (to a millisecond): a wrong
    guess (trio's clocks carry an offset of hours from asyncio's) falls back to anyio's.
    """
    clock = _guess()
    if clock is not anyio.current_time and abs(clock() - anyio.current_time()) > 0.001:
        return anyio.current_time  # pragma: no cover - a backend we guessed wrong
    return clock


def _guess() -> Callable[[], float]:
    trio = sys.modules.get("trio")  # not imported: not running under trio
    if trio is not None and trio.lowlevel.in_trio_run():
        return cast("Callable[[], float]", trio.current_time)
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:  # another backend: ask anyio each time
        return anyio.current_time
