"""A room's life: its settings, opening (read-write or read-only), closing, and the one
connection its calls go through. :class:`~subagents.room.Room` adds the calls."""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Self

import anyio
import anyio.lowlevel
import anyio.to_thread

from .._validators import seconds, thread_wait
from ..store._opening import close_all
from ..store._sqlite import Connection, Synchronous
from ..store._watch import Watcher
from ._checks import check_synchronous
from ._db import Database
from ._opening import open_read_only_pair, open_read_write
from ._waiting import Waiters

__all__ = ["RoomBase"]


class RoomBase:
    """Open, close and reach the connection; see :class:`~subagents.room.Room`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 10.0,
        poll_interval: float = 0.005,
        retry_window: float = 30.0,
        synchronous: Synchronous = "NORMAL",
        read_only: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self._clock = clock
        self._busy_timeout = thread_wait("busy_timeout", busy_timeout, zero_ok=False)
        self._poll_interval = thread_wait("poll_interval", poll_interval, zero_ok=False)
        self._retry_window = seconds("retry_window", retry_window, none_ok=False, zero_ok=True)
        self._synchronous = check_synchronous(synchronous)
        self._read_only = bool(read_only)
        self._closed = False
        self._opening = False
        self._database: Database | None = None
        self._watcher: Watcher | None = None
        self._waiters = Waiters()

    async def __aenter__(self) -> Self:
        # Marked before the first await: a second entry while the first opens is refused,
        # not a second set of connections replacing the first's.
        if self._database is not None or self._opening:
            raise RuntimeError("this Room is open already: enter it once (one `async with`)")
        self._opening = True
        try:
            return await self._open()
        finally:
            self._opening = False

    async def _open(self) -> Self:
        self._closed = False
        self._waiters = Waiters()
        # Read-only too, a watcher: a timed peek or receive is woken by other processes.
        opening = (
            functools.partial(open_read_only_pair, self.path, busy_timeout=self._busy_timeout)
            if self._read_only
            else functools.partial(
                open_read_write,
                self.path,
                synchronous=self._synchronous,
                busy_timeout=self._busy_timeout,
            )
        )
        raw, watching = await anyio.to_thread.run_sync(opening)
        await self._unless_closed(raw, watching)
        self._database = self._database_of(raw)
        self._watcher = Watcher(
            watching,
            token=anyio.lowlevel.current_token(),
            interval=self._poll_interval,
            on_change=self._waiters.changed,
        )
        self._watcher.start()
        self._waiters.watcher = self._watcher
        return self

    async def _unless_closed(self, *opened: sqlite3.Connection) -> None:
        """An ``aclose`` that ran while the file opened wins: what opened closes."""
        if self._closed:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(close_all, list(opened))
            raise anyio.ClosedResourceError("the room was closed while it opened")

    def _database_of(self, raw: sqlite3.Connection) -> Database:
        conn = Connection(
            raw, path=self.path, busy_timeout=self._busy_timeout, retry_timeout=self._busy_timeout
        )
        return Database(
            conn,
            clock=self._clock,
            waiters=self._waiters,
            retry_window=self._retry_window,
            read_only=self._read_only,
        )

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the room: waiting receives end (``anyio.ClosedResourceError``), then the
        connections close, also in a cancelled scope."""
        watcher, database = self._watcher, self._database
        self._watcher, self._database = None, None
        self._closed = True
        self._waiters.watcher = None
        self._waiters.close()
        with anyio.CancelScope(shield=True):  # cancelled, the connections must close still
            if watcher is not None:
                watcher.stop()
                await anyio.to_thread.run_sync(watcher.join, None)
            if database is not None:
                await anyio.to_thread.run_sync(database.close)

    def _db(self) -> Database:
        if self._database is None:
            if self._closed:
                raise anyio.ClosedResourceError("the room is closed")
            raise RuntimeError("the room is not open: use `async with Room(path) as room`")
        return self._database
