"""Reading a store's file without changing anything on disk: the ``status`` and ``export``
commands' connections.

A read-only SQLite connection to a WAL file creates ``-wal`` and ``-shm`` files when
they are missing and, being read-only, cannot remove them afterwards. So the connection
depends on what is beside the file:

- **a ``-wal`` file** (a process has the store open, or one ended without closing it):
  ``mode=ro``, which reads the committed state through the WAL and its ``-shm`` index;
- **no ``-wal`` file** (no process has the store open: SQLite deletes the WAL when the
  last connection closes): ``immutable=1``, which reads the main file alone, takes no
  lock and creates nothing. Immutable means SQLite assumes the file cannot change, so
  each read is checked afterwards: if a ``-wal`` appeared or the file changed meanwhile
  (its size or times: a process opened the store and checkpointed), the read is thrown
  away and made again, through the WAL if it is still there.

A ``-wal`` without its ``-shm`` (left by a crash, then the ``-shm`` deleted by hand) is the
one case where a read creates a file: SQLite rebuilds the ``-shm`` index.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Final, NamedTuple, TypeVar

from ._errors import StoreError
from ._files import check_existing
from ._schema import SCHEMA_VERSION, current_version
from ._sqlite import translate

__all__ = ["ReadOnlyStore"]

T = TypeVar("T")

_IMMUTABLE_TRIES: Final = 3
"""How many immutable reads processes opening the store may spoil before the read goes
through the WAL instead (which creates ``-wal`` and ``-shm`` if they have closed again)."""


class _Fingerprint(NamedTuple):
    """What changes when a process opens the store or writes into its file."""

    wal: bool
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


class ReadOnlyStore:
    """A store's file, read and never written: each :meth:`read` sees committed rows.

    Made with the store's own checks (:func:`._files.check_existing`), so a file that
    is not a store is refused before SQLite opens it; a missing or empty file is refused
    too, since a store is only ever created by opening it for writing.

    Raises:
        StoreError: from the constructor, the file is not a readable store.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float) -> None:
        self.path = Path(path)
        """The file."""
        self.where = str(path)
        """The file as given, for messages."""
        self._busy_timeout = busy_timeout
        self._through_wal: sqlite3.Connection | None = None
        check_existing(self.path, SCHEMA_VERSION)
        try:
            self.schema_version: int = self.read(lambda conn: current_version(conn, self.where))
            if self.schema_version == 0:
                raise StoreError(self.where, "not_a_store", "no store here: an empty database")
        except BaseException:
            self.close()
            raise

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """``query(conn)`` on a connection that sees what is committed. Blocking.

        Raises:
            StoreError: a ``sqlite3`` error, translated.
        """
        try:
            for _ in range(_IMMUTABLE_TRIES):
                if self._through_wal is not None:
                    break
                before = self._fingerprint()
                if before.wal:  # a process has the store open: read through its WAL
                    break
                conn = self._connect("mode=ro&immutable=1")
                try:
                    result = query(conn)
                except sqlite3.Error:
                    # A file changed under an immutable read may look damaged: only an
                    # error of a file that stayed as it was is the file's.
                    if self._fingerprint() == before:
                        raise
                    continue
                finally:
                    conn.close()
                if self._fingerprint() == before:
                    return result
            # Kept from here on: while it is open, the WAL is never deleted under it.
            if self._through_wal is None:
                self._through_wal = self._connect("mode=ro")
            return query(self._through_wal)
        except sqlite3.Error as exc:
            raise translate(exc, self.where) from exc

    def _fingerprint(self) -> _Fingerprint:
        """Whether a ``-wal`` exists, and the main file's identity, size and times."""
        wal = self.path.parent / f"{self.path.name}-wal"
        try:
            found = self.path.stat()
        except OSError as exc:
            raise StoreError(self.where, "failed", f"the file cannot be read ({exc})") from exc
        return _Fingerprint(
            wal.exists(), found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns
        )

    def _connect(self, options: str) -> sqlite3.Connection:
        uri = f"{self.path.absolute().as_uri()}?{options}"
        return sqlite3.connect(uri, uri=True, timeout=self._busy_timeout, isolation_level=None)

    def close(self) -> None:
        """Close the connection through the WAL, if one was opened."""
        if self._through_wal is not None:
            self._through_wal.close()
            self._through_wal = None

    def __enter__(self) -> ReadOnlyStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
