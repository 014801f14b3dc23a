"""Opening a room's file: read-write (the store's opening: created or migrated, the
writer's connection and the watcher's) or read-only (nothing created or migrated).

A read-only open is what a look from a shell needs (``subagents room who``): opening an
older store read-write would migrate it, after which an older install refuses the file,
and an empty file would become a store.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ..store._errors import StoreError
from ..store._opening import close_all, open_connections
from ..store._schema import SCHEMA_VERSION, current_version
from ..store._sqlite import Synchronous, retrying, translate

__all__ = ["open_read_only", "open_read_only_pair", "open_read_write"]


def open_read_write(
    path: str, *, synchronous: Synchronous, busy_timeout: float
) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """The writer's and the watcher's connections of the store at ``path`` (created or
    migrated). Blocking."""
    connections = open_connections(path, synchronous=synchronous, busy_timeout=busy_timeout)
    close_all([connections.loop])
    return connections.writer, connections.watcher


def open_read_only(path: str, *, busy_timeout: float) -> sqlite3.Connection:
    """A read-only connection to the store at ``path``, which must already have the room's
    tables. Blocking.

    Raises:
        StoreError: ``not_a_store`` for a missing or empty file, a store of an older
            schema (no rooms yet) or another application's database; as opening does
            otherwise.
    """
    file = Path(path)
    if not file.is_file() or file.stat().st_size == 0:
        raise StoreError(
            path, "not_a_store", "no store here: the file is missing or empty (read-only)"
        )
    try:
        raw = sqlite3.connect(
            f"{file.resolve().as_uri()}?mode=ro",
            uri=True,
            timeout=busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
    except sqlite3.Error as exc:
        raise translate(exc, path) from exc
    try:
        version = retrying(lambda: current_version(raw, path), path=path, timeout=busy_timeout)
        if version < SCHEMA_VERSION:
            raise StoreError(
                path,
                "not_a_store",
                f"the store has schema version {version}, without the room's tables "
                f"(version {SCHEMA_VERSION}); read-only, it is not migrated",
            )
    except BaseException:
        close_all([raw])
        raise
    return raw


def open_read_only_pair(
    path: str, *, busy_timeout: float
) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """Two read-only connections to the store at ``path``: the room's, and its watcher's
    (``PRAGMA data_version`` is readable without writing). Blocking.

    Raises:
        StoreError: as :func:`open_read_only`.
    """
    raw = open_read_only(path, busy_timeout=busy_timeout)
    try:
        return raw, open_read_only(path, busy_timeout=busy_timeout)
    except BaseException:
        close_all([raw])
        raise
