"""One live thread at a time: an object whose state changes without a lock names its owner.

An object that an event loop mutates without locking (a pool, a cache) is safe while one
thread's loop uses it. :class:`ThreadOwner` makes the first thread that uses it the owner
for as long as that thread lives, refuses every other thread meanwhile with an error that
names both, and lets a thread take over once the owner has ended (a program that runs
``anyio.run`` in one worker thread after another).
"""

from __future__ import annotations

import threading

__all__ = ["ThreadOwner"]


class ThreadOwner:
    """The thread allowed to use one object (``what`` names it in the error)."""

    __slots__ = ("_lock", "_owner", "_what")

    def __init__(self, what: str) -> None:
        self._what = what
        self._owner: threading.Thread | None = None
        self._lock = threading.Lock()

    def claim(self) -> None:
        """Make the calling thread the owner, unless another live thread is. Costs an
        attribute read once the caller owns it.

        Raises:
            RuntimeError: another thread that is still alive owns the object.
        """
        current = threading.current_thread()
        if self._owner is current:
            return
        with self._lock:
            owner = self._owner
            if owner is not None and owner is not current and owner.is_alive():
                raise RuntimeError(
                    f"this {self._what} serves the event loop of thread {owner.name!r}; "
                    f"thread {current.name!r} needs a {self._what} of its own"
                )
            self._owner = current
