"""A room's connection: one ``sqlite3`` connection used by one worker thread at a time,
its transactions, the room's clock read inside them, and a member's activity.

Every call runs in a worker thread (``anyio.to_thread``), its reads and writes in one
``BEGIN IMMEDIATE`` transaction inside the store's retry loop (``_sqlite.Connection``),
and reads the clock inside it, so the time a call records is a time it held the database.
A commit wakes this process's waiting receives at once (other processes' see it through
``data_version``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar, cast

import anyio
import anyio.to_thread

from ..store._errors import StoreError
from ..store._sqlite import Connection
from . import _members, _messages
from ._ids import resolve_member
from ._waiting import Waiters

__all__ = ["Database"]

T = TypeVar("T")


class Database:
    """The connection of one open :class:`Room` (``read_only``: every write refused)."""

    def __init__(
        self,
        conn: Connection,
        *,
        clock: Callable[[], float],
        waiters: Waiters,
        retry_window: float,
        read_only: bool = False,
    ) -> None:
        self.conn = conn
        self._clock = clock
        self._waiters = waiters
        self._retry_window = retry_window
        self._read_only = read_only
        self._lock = threading.Lock()
        self._closed = False

    async def write(self, body: Callable[[sqlite3.Connection, float], T]) -> T:
        """``body(raw, now)`` in a write transaction, committed."""
        # No precheck: write() answers body's result, never its None.
        return cast("T", await self.maybe_write(body, None))

    async def maybe_write(
        self,
        body: Callable[[sqlite3.Connection, float], T],
        precheck: Callable[[sqlite3.Connection], bool] | None,
        *,
        timeout: float | None = None,
    ) -> T | None:
        """``body`` in a write transaction; ``None`` with nothing written when
        ``precheck`` (a read in the same retry loop) says there is nothing to do. With
        ``timeout``, the waits for this process's other call and for another process's
        lock end after that many seconds (``StoreError(locked)``), not ``busy_timeout``."""
        if self._read_only:
            raise StoreError(self.conn.path, "unwritable", "the room was opened read_only")
        wrote = []

        def transaction(raw: sqlite3.Connection) -> T:
            wrote.append(True)
            return body(raw, self._clock())

        def run() -> T | None:
            if timeout is None:
                with self._held(None):
                    return self.conn.write(transaction, precheck=precheck)
            return self._bounded(transaction, precheck, timeout)

        result = await anyio.to_thread.run_sync(run)
        if wrote:
            self._waiters.changed()  # a waiter of this process looks at once, without the poll
        return result

    def _bounded(
        self,
        transaction: Callable[[sqlite3.Connection], T],
        precheck: Callable[[sqlite3.Connection], bool] | None,
        timeout: float,
    ) -> T | None:
        end = time.monotonic() + timeout
        path = self.conn.path
        tries: list[bool] = []

        def bounded(raw: sqlite3.Connection) -> bool:
            # Before each try of the retry loop: SQLite's wait is what is left, no more;
            # the first try always runs, so a short wait still takes when nothing is held.
            left = end - time.monotonic()
            if left <= 0 and tries:
                raise StoreError(path, "locked", "another connection held the lock past the wait")
            tries.append(True)
            raw.execute(f"PRAGMA busy_timeout = {max(1, int(left * 1000))}")
            return precheck is None or precheck(raw)

        with self._held(timeout):
            raw = self.conn.raw
            try:
                limited = Connection(raw, path=path, busy_timeout=timeout, retry_timeout=timeout)
                return limited.write(transaction, precheck=bounded)
            finally:
                raw.execute(f"PRAGMA busy_timeout = {int(self.conn.busy_timeout * 1000)}")

    async def read(
        self, query: Callable[[sqlite3.Connection, float], T], *, timeout: float | None = None
    ) -> T:
        """``query(raw, now)`` in autocommit mode (no transaction, nothing written). With
        ``timeout``, the wait for this process's other call ends after that many seconds
        (``StoreError(locked)``); a read waits for no other process's lock (WAL)."""

        def run() -> T:
            with self._held(timeout):
                return self.conn.read(lambda raw: query(raw, self._clock()))

        return await anyio.to_thread.run_sync(run)

    @contextmanager
    def _held(self, timeout: float | None) -> Iterator[None]:
        """The connection, this process's other calls kept out (``timeout``: the most
        seconds to wait for them, then ``StoreError(locked)``). A call that got here as
        the room closed finds the connection closed: ``anyio.ClosedResourceError``, as
        for a call after the close, not SQLite's error about a closed database."""
        if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise StoreError(self.conn.path, "locked", "this process's other room call held it")
        try:
            if self._closed:
                raise anyio.ClosedResourceError("the room is closed")
            yield
        finally:
            self._lock.release()

    async def look(
        self,
        member: object,
        query: Callable[[sqlite3.Connection, str, float], T],
        *,
        timeout: float | None = None,
    ) -> T:
        """``query(raw, member, now)`` as a :meth:`read`, the id checked
        (``UnknownMember``): a look at a member that is not its activity."""
        return await self.read(
            lambda raw, now: query(raw, resolve_member(raw, member, self.conn.path), now),
            timeout=timeout,
        )

    def acting(
        self, member: object, body: Callable[[sqlite3.Connection, str, float], T]
    ) -> Callable[[sqlite3.Connection, float], T]:
        """``body`` as ``member``'s call: the id checked (``UnknownMember``), its activity
        recorded, wake signals due repeated."""

        def run(raw: sqlite3.Connection, now: float) -> T:
            found = resolve_member(raw, member, self.conn.path)
            _members.touch(raw, found, now)
            _messages.resend_signals(raw, now, self._retry_window)
            return body(raw, found, now)

        return run

    async def act(self, member: object, body: Callable[[sqlite3.Connection, str, float], T]) -> T:
        """:meth:`acting` in a write transaction."""
        return await self.write(self.acting(member, body))

    def close(self) -> None:
        """Close the connection once the call in flight (a worker thread's) ended."""
        with self._lock:
            self._closed = True
            self.conn.close()
