"""Connections, pragmas and transactions: the store's only use of ``sqlite3`` outside SQL.

Every connection runs in autocommit mode (``isolation_level=None``) and opens its write
transactions itself with ``BEGIN IMMEDIATE``: a deferred transaction that upgrades to a
write gets ``SQLITE_BUSY`` at once, without honouring the busy timeout. Reads are single
autocommit statements whose rows are fetched at once, so no read transaction outlives the
call (an open one would stop the WAL checkpoint and grow the WAL). A transaction and the
reads that decide whether to write run inside one retry loop (:func:`retrying`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Final, Literal, TypeVar

from .._retry import call_with_retries
from ._errors import StoreError

__all__ = ["Connection", "Synchronous", "connect", "immediate", "is_busy", "retrying", "translate"]

T = TypeVar("T")

Synchronous = Literal["FULL", "NORMAL"]
"""``PRAGMA synchronous`` in WAL mode: ``FULL`` fsyncs the WAL at every commit (commits
survive a power loss); ``NORMAL`` only at checkpoints (commits survive a process crash)."""

_BUSY: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_REASONS: Final = {
    sqlite3.SQLITE_BUSY: "locked",
    sqlite3.SQLITE_LOCKED: "locked",
    sqlite3.SQLITE_CORRUPT: "corrupt",
    sqlite3.SQLITE_NOTADB: "not_sqlite",
    sqlite3.SQLITE_READONLY: "unwritable",
    sqlite3.SQLITE_CANTOPEN: "unwritable",
    sqlite3.SQLITE_PERM: "unwritable",
}


def _code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_busy(exc: BaseException) -> bool:
    """True for ``SQLITE_BUSY`` / ``SQLITE_LOCKED`` (any extended code): worth retrying."""
    return isinstance(exc, sqlite3.OperationalError) and _code(exc) in _BUSY


def translate(exc: sqlite3.Error, path: str) -> StoreError:
    """The :class:`StoreError` for a ``sqlite3`` error."""
    reason = _REASONS.get(_code(exc) or 0, "failed")
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    return StoreError(path, reason, f"SQLite: {exc} ({name})")


def connect(path: str, *, synchronous: Synchronous, busy_timeout: float) -> sqlite3.Connection:
    """A connection to ``path`` with the store's pragmas; usable from one thread at a time
    (not necessarily the one that opened it).

    Raises:
        sqlite3.Error: the file cannot be opened.
    """
    conn = sqlite3.connect(
        path,
        timeout=busy_timeout,
        isolation_level=None,
        check_same_thread=False,
        cached_statements=128,
    )
    try:
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``; rolled back if the body or the commit raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            # The first error is the one to report; if this fails SQLite rolled back already.
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def retrying(attempt: Callable[[], T], *, path: str, timeout: float) -> T:
    """Run ``attempt()``, retrying it whole while SQLite answers busy, for up to
    ``timeout`` seconds after the first busy answer (each try may also wait up to the
    connection's busy timeout inside SQLite). Blocks the calling thread.

    Raises:
        StoreError: a ``sqlite3`` error, translated (``locked`` when still busy).
    """
    try:
        return call_with_retries(attempt, retry_if=is_busy, timeout=timeout)
    except sqlite3.Error as exc:
        raise translate(exc, path) from exc


class Connection:
    """One connection, the retry loop and the gate its writes take.

    ``gate`` is the lock the store's writer thread holds around each of its transactions:
    a write here first waits for the writer's transaction in flight to end (a thread lock,
    exact, instead of SQLite's busy handler, which sleeps in steps of 1 to 100 ms), and
    while it holds the gate the writer takes no new work. Neither waits for the gate longer
    than ``busy_timeout``: past it the write fails as ``locked``, as SQLite's own wait does.

    ``retry_timeout`` bounds the retries after SQLite answered busy (some busy answers
    come back at once, without waiting); the event loop's connection keeps it short.
    """

    def __init__(
        self,
        raw: sqlite3.Connection,
        *,
        path: str,
        busy_timeout: float,
        retry_timeout: float,
        gate: threading.Lock | None = None,
    ) -> None:
        self.raw = raw
        self.path = path
        self.busy_timeout = busy_timeout
        self.retry_timeout = retry_timeout
        self._gate = gate

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """``query(raw)`` in autocommit mode, retried while busy. Blocks the calling thread
        for the query's time (microseconds for the store's indexed reads)."""
        return retrying(lambda: query(self.raw), path=self.path, timeout=self.retry_timeout)

    def write(
        self,
        body: Callable[[sqlite3.Connection], T],
        *,
        precheck: Callable[[sqlite3.Connection], bool] | None = None,
        undo: Callable[[], object] | None = None,
    ) -> T | None:
        """``body(raw)`` inside the gate and ``BEGIN IMMEDIATE``, committed; ``None``
        without a transaction when ``precheck(raw)`` (a read, in the same retry loop) says
        there is nothing to write. ``undo()`` runs, the gate still held, after a try whose
        transaction rolled back. Blocks the calling thread until committed.

        Raises:
            StoreError: ``locked`` when the gate or SQLite's lock stayed taken.
        """
        raw = self.raw
        gate = self._gate

        def attempt() -> T | None:
            if precheck is not None and not precheck(raw):
                return None
            if gate is not None and not gate.acquire(timeout=self.busy_timeout):
                raise StoreError(
                    self.path,
                    "locked",
                    f"this process's writer thread held the database for over "
                    f"{self.busy_timeout:g} s (busy_timeout)",
                )
            try:
                with immediate(raw):
                    return body(raw)
            except BaseException:
                if undo is not None:
                    undo()
                raise
            finally:
                if gate is not None:
                    gate.release()

        return retrying(attempt, path=self.path, timeout=self.retry_timeout)

    def close(self) -> None:
        self.raw.close()
