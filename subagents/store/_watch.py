"""Cross-process wake-up: a thread polls ``PRAGMA data_version`` while anyone waits.

``data_version`` (a few microseconds, no transaction) changes whenever another connection,
in this process or another, commits. The thread polls it every ``interval`` seconds, but
only while :meth:`Watcher.watch` has been told that something waits; otherwise it sleeps
on a condition and costs nothing. On a change it calls ``on_change`` on the event loop,
which looks again at what the waiters wait for.

No change can be missed: the version is read before ``on_change`` runs, and ``on_change``
reads the database afresh, so a commit after that read changes the version again. The
first version is read by :meth:`Watcher.start`, before anyone can look: read when the
thread first runs, it could already hold a commit made after a waiter's look, which would
then never be reported.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable

import anyio.from_thread
from anyio.lowlevel import EventLoopToken

__all__ = ["Watcher"]

logger = logging.getLogger("subagents.store")


class Watcher:
    """The polling thread of one store."""

    def __init__(
        self,
        raw: sqlite3.Connection,
        *,
        token: EventLoopToken,
        interval: float,
        on_change: Callable[[], object],
    ) -> None:
        self._raw = raw
        self._token = token
        self._interval = interval
        self._on_change = on_change
        self._cond = threading.Condition()
        self._active = False
        self._stopping = False
        self.polls = 0
        """``data_version`` reads so far."""
        self.changes = 0
        """Changes seen (each one a call of ``on_change``)."""
        self._first = 0  # the version start() read
        self._thread = threading.Thread(target=self._run, name="subagents-store-watcher")
        self._thread.daemon = True

    def start(self) -> None:
        """Read the version to compare with, then start the thread."""
        self._first = self._version()
        self._thread.start()

    def watch(self, active: bool) -> None:
        """Poll (``True``) or stop polling (``False``). Never blocks."""
        with self._cond:
            if active != self._active:
                self._active = active
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def join(self, timeout: float | None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _version(self) -> int:
        self.polls += 1
        ((version,),) = self._raw.execute("PRAGMA data_version").fetchall()
        return int(version)

    def _run(self) -> None:
        try:
            version = self._first
            while True:
                with self._cond:
                    while not self._active and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
                        return
                    self._cond.wait(self._interval)  # wakes early only to stop
                    if self._stopping:
                        return
                current = self._version()
                if current != version:
                    version = current
                    self.changes += 1
                    anyio.from_thread.run_sync(self._on_change, token=self._token)
        except anyio.RunFinishedError:
            pass  # the event loop ended without closing the store
        except Exception:
            logger.exception("the store's watcher thread failed; cross-process wake-ups stop")
        finally:
            self._raw.close()
