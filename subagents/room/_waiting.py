"""A receive that waits: the events of this process's waiting receives, woken by the
store's watcher thread (``PRAGMA data_version`` changed: some connection, of any process,
committed) and by this process's own commits.

A waiter registers its event *before* it looks again, so a commit after that look changes
``data_version`` after the watcher's last read and sets the event; the look itself writes
nothing unless there is something to take, or each wake-up would commit, wake every
waiter of the file, and so on without end.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from ..store._watch import Watcher

__all__ = ["Waiters"]

T = TypeVar("T")


class Waiters:
    """The waiting receives of one :class:`Room`."""

    def __init__(self) -> None:
        self._events: set[anyio.Event] = set()
        self.watcher: Watcher | None = None
        self.closed = False

    def changed(self) -> None:
        """Something committed: every waiter looks again."""
        for event in self._events:
            event.set()

    def close(self) -> None:
        """The room closes: every waiter ends, with ``anyio.ClosedResourceError``."""
        self.closed = True
        self.changed()

    def _watch(self) -> None:
        if self.watcher is not None:
            self.watcher.watch(bool(self._events))

    async def until(
        self,
        got: T,
        done: Callable[[T], bool],
        look: Callable[[float | None], Awaitable[T | None]],
        deadline: float | None,
    ) -> T:
        """``got`` once ``done(got)``, else look again (``look(seconds left)``: ``None``
        when there was nothing) after each change, until ``deadline``
        (``anyio.current_time``; ``None``: none); at the deadline the last answer.

        Raises:
            anyio.ClosedResourceError: the room closed while this waited.
        """
        while not done(got):
            if self.closed:
                raise anyio.ClosedResourceError("the room closed while a receive waited")
            left = None if deadline is None else deadline - anyio.current_time()
            if left is not None and left <= 0:
                return got
            event = anyio.Event()
            self._events.add(event)
            self._watch()
            try:
                again = await look(left)
                if again is None:
                    left = None if deadline is None else deadline - anyio.current_time()
                    with anyio.move_on_after(left if left is not None else float("inf")):
                        await event.wait()
                else:
                    got = again
            finally:
                self._events.discard(event)
                self._watch()
        return got
