"""One thread at a time: an object whose state changes without a lock, while it is in use.

An object that an event loop mutates without locking (a pool, a cache) is safe while one
thread's loop uses it. :meth:`ThreadOwner.using` wraps each use: while uses of one thread
are in progress, a use from another thread is refused with an error that names both;
once the last of them ends, any thread may begin. Ownership ends with the uses, not with
the thread, so a thread that lives on (an executor's worker, a server's request thread,
one not made by :mod:`threading`, whose liveness cannot be told) holds nothing between
uses.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ThreadOwner"]


class ThreadOwner:
    """The thread whose uses of one object are in progress (``what`` names the object in
    the error)."""

    __slots__ = ("_lock", "_owner", "_uses", "_what")

    def __init__(self, what: str) -> None:
        self._what = what
        self._owner: threading.Thread | None = None
        self._uses = 0
        self._lock = threading.Lock()

    @contextmanager
    def using(self) -> Iterator[None]:
        """Around one use (``with owner.using(): ...``).

        Raises:
            RuntimeError: on entry, while another thread's uses are in progress.
        """
        current = threading.current_thread()
        with self._lock:
            owner = self._owner
            if owner is not None and owner is not current:
                raise RuntimeError(
                    f"this {self._what} is in use by the event loop of thread "
                    f"{owner.name!r}; thread {current.name!r} needs a {self._what} of its own"
                )
            self._owner = current
            self._uses += 1
        try:
            yield
        finally:
            with self._lock:
                self._uses -= 1
                if not self._uses:
                    self._owner = None
