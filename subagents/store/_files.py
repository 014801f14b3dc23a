"""What a file is before SQLite touches it: read from its 100-byte header, so that
opening something that is not a store changes nothing on disk (SQLite would create
``-wal`` and ``-shm`` files beside it, and a migration would write into it).

The header layout is SQLite's file format (https://sqlite.org/fileformat.html, 1.3).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Final

import attrs

from ._errors import StoreError

__all__ = ["APPLICATION_ID", "Header", "check_before_open", "check_existing"]

_SETTLE_TRIES: Final = 5
_SETTLE_WAIT: Final = 0.02
"""Seconds between two looks at a file that reads as truncated."""

APPLICATION_ID: Final = 0x73756261
"""``PRAGMA application_id`` of every store: ``suba`` in ASCII, at offset 68 of the header."""

_MAGIC: Final = b"SQLite format 3\x00"
_HEADER_BYTES: Final = 100


@attrs.frozen(kw_only=True)
class Header:
    """The fields of a SQLite header the store checks."""

    page_size: int
    """Bytes per page."""
    pages: int | None
    """Pages the header says the file holds; ``None`` when that field is not valid."""
    wal: bool
    """The file is in WAL mode."""
    user_version: int
    """``PRAGMA user_version``: the store's schema version."""
    application_id: int
    """``PRAGMA application_id``: :data:`APPLICATION_ID` for a store."""
    size: int
    """The file's size in bytes when the header was read."""

    @property
    def truncated(self) -> bool:
        """Shorter than the pages the header declares."""
        return self.pages is not None and self.pages * self.page_size > self.size


def _u32(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 4], "big")


def read_header(path: Path) -> Header | None:
    """The header of the file at ``path``, or ``None`` for an empty file.

    Raises:
        StoreError: ``not_sqlite`` for anything else that is not a SQLite database.
    """
    where = str(path)
    try:
        with path.open("rb") as file:
            data = file.read(_HEADER_BYTES)
            size = os.fstat(file.fileno()).st_size
    except PermissionError as exc:
        raise StoreError(where, "unwritable", f"the file cannot be read ({exc.strerror})") from exc
    except OSError as exc:
        raise StoreError(where, "failed", f"the file cannot be read ({exc})") from exc
    if not data:
        return None
    if len(data) < _HEADER_BYTES or not data.startswith(_MAGIC):
        what = "too short for a SQLite header" if data.startswith(_MAGIC) else "no SQLite header"
        raise StoreError(where, "not_sqlite", f"not a SQLite database ({what})")
    raw_page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if raw_page_size == 1 else raw_page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise StoreError(where, "not_sqlite", f"not a SQLite database (page size {page_size})")
    # The page count is valid only when "version-valid-for" matches the change counter.
    pages = _u32(data, 28) if _u32(data, 92) == _u32(data, 24) else None
    return Header(
        page_size=page_size,
        pages=pages,
        wal=data[18] == 2 and data[19] == 2,
        user_version=_u32(data, 60),
        application_id=_u32(data, 68),
        size=size,
    )


def _has_wal(path: Path) -> bool:
    try:
        return (path.parent / f"{path.name}-wal").stat().st_size > 0
    except OSError:
        return False


def check_before_open(path: Path, schema_version: int) -> bool:
    """Refuse, without writing anything, a path the store must not open.

    Returns ``True`` when the store is new (no file, or an empty one) and ``False`` for an
    existing store whose header looks right, or may: beside a non-empty ``-wal`` file the
    header on disk may be older than the one in the WAL, and the checks are left to the
    migration's transaction (which reads through the WAL).

    Raises:
        StoreError: the path is a directory or special file, its directory is missing or
            not writable (WAL needs ``-wal`` and ``-shm`` files beside the store), the file
            is not SQLite, is another application's database, is truncated, or has a
            schema newer than ``schema_version``.
    """
    where = str(path)
    directory = path.parent
    if not directory.is_dir():
        raise StoreError(where, "unwritable", f"the directory {str(directory)!r} does not exist")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise StoreError(where, "unwritable", "the path exists and is not a regular file")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise StoreError(
            where,
            "unwritable",
            f"the directory {str(directory)!r} is not writable: SQLite's WAL mode creates "
            f"{path.name}-wal and {path.name}-shm beside the store",
        )
    if mode is None:
        return True
    header = read_header(path)
    if header is None:
        return True
    if header.truncated and not (header.wal and _has_wal(path)):
        header = _settled(path, header)
    if header.wal and _has_wal(path):
        # The newest header may be in the WAL (a store just created or migrated by a
        # process that has not checkpointed yet): SQLite reads it once the file is open,
        # and the migration's transaction checks it (``_schema.current_version``).
        return False
    if header.application_id != APPLICATION_ID:
        raise StoreError(
            where,
            "not_a_store",
            f"not a subagents store: its application_id is {header.application_id:#x}, "
            f"a store's is {APPLICATION_ID:#x} (another program's database?)",
        )
    if header.user_version > schema_version:
        raise StoreError(
            where,
            "newer_schema",
            f"the store has schema version {header.user_version}; this version of subagents "
            f"reads up to {schema_version}: upgrade subagents to open it",
        )
    if not os.access(path, os.R_OK | os.W_OK):
        raise StoreError(where, "unwritable", "the file is not readable and writable")
    return False


def _settled(path: Path, header: Header) -> Header:
    """The header of a file that reads as truncated, read again while that may be another
    process's checkpoint at work (it writes the header's page first and the file grows as
    the later pages follow; its WAL may have gone by the time it is looked for).

    Raises:
        StoreError: ``truncated``: the file stays shorter than its header declares.
    """
    for _ in range(_SETTLE_TRIES):
        time.sleep(_SETTLE_WAIT)  # in a worker thread (the store's open) or the CLI
        again = read_header(path)
        if again is None:
            continue
        header = again
        if not header.truncated or (header.wal and _has_wal(path)):
            return header
    raise StoreError(
        str(path),
        "truncated",
        f"truncated: the header declares {header.pages} pages of {header.page_size} bytes "
        f"({(header.pages or 0) * header.page_size} bytes) but the file holds {header.size}",
    )


def check_existing(path: Path, schema_version: int) -> None:
    """:func:`check_before_open`, and refuse a path with no store yet (no file, or an
    empty one): for the commands that must not create a store.

    Raises:
        StoreError: what :func:`check_before_open` raises, or ``not_a_store``.
    """
    if check_before_open(path, schema_version):
        what = "the file is empty" if path.exists() else "no such file"
        raise StoreError(str(path), "not_a_store", f"no store here: {what}")
