"""Opening a store's file: refuse what is not a store, switch to WAL, migrate, connect.

Runs in a worker thread (it may wait for another process's lock). The order is what keeps
a refused file untouched: the header checks of :func:`._files.check_before_open` first,
then, for an existing file, SQLite's own reads of the schema, and only then
``PRAGMA journal_mode = WAL`` (which would convert a rollback-journal file) and the
migration, inside ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Final, NamedTuple

from ._errors import StoreError
from ._files import check_before_open
from ._schema import SCHEMA_VERSION, current_version, migrate
from ._sqlite import Synchronous, connect, immediate, retrying, translate

__all__ = ["Connections", "close_all", "open_connections"]

logger = logging.getLogger("subagents.store")

MIN_SQLITE: Final = (3, 38, 0)
"""``RETURNING`` came in 3.35; the JSON functions are built in since 3.38."""


class Connections(NamedTuple):
    """The three connections of an open store, each for one thread."""

    writer: sqlite3.Connection
    loop: sqlite3.Connection
    watcher: sqlite3.Connection


def close_all(connections: list[sqlite3.Connection]) -> None:
    """Close each; a failure is logged (the error that led here is the one to report)."""
    for raw in connections:
        try:
            raw.close()
        except sqlite3.Error:
            logger.exception("closing a connection of a store failed")


def open_connections(path: str, *, synchronous: Synchronous, busy_timeout: float) -> Connections:
    """Check, create or migrate the store at ``path`` and connect three times. Blocking.

    Raises:
        StoreError: see :class:`SqliteStore`; nothing was changed on disk.
    """
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise StoreError(
            path,
            "failed",
            f"the store needs SQLite {'.'.join(map(str, MIN_SQLITE))} or newer (for "
            f"UPDATE … RETURNING and JSON); this Python has SQLite {sqlite3.sqlite_version}",
        )
    new = check_before_open(Path(path), SCHEMA_VERSION)
    opened: list[sqlite3.Connection] = []

    def connection(sync: Synchronous) -> sqlite3.Connection:
        raw = connect(path, synchronous=sync, busy_timeout=busy_timeout)
        opened.append(raw)
        return raw

    try:
        writer = retrying(lambda: connection(synchronous), path=path, timeout=busy_timeout)

        def set_up() -> None:
            if not new:  # reads only: refuse before WAL mode converts anything
                current_version(writer, path)
            ((mode,),) = writer.execute("PRAGMA journal_mode = WAL").fetchall()
            if str(mode).lower() != "wal":
                raise StoreError(path, "failed", f"SQLite refused WAL mode (got {mode!r})")
            with immediate(writer):
                found = migrate(writer, path)
            if found < SCHEMA_VERSION:
                # Copy the new header into the main file at once, so the next process's
                # header check (made before SQLite opens the file) reads it there.
                writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

        retrying(set_up, path=path, timeout=busy_timeout)
        # The event loop's connection commits takes without an fsync of its own: a take
        # survives a process crash; the writer's next commit makes it survive a power
        # loss too (see "Durability" in design/store.md).
        return Connections(writer, connection("NORMAL"), connection("NORMAL"))
    except sqlite3.Error as exc:
        close_all(opened)
        raise translate(exc, path) from exc
    except BaseException:
        close_all(opened)
        raise
