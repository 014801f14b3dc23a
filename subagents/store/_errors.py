"""The store's exception: one class with a machine-readable ``reason``, under
:class:`~subagents.SubagentsError`::

    SubagentsError
    └── StoreError(SubagentsError)     the store cannot open, read or write its file

A closed store raises anyio's ``ClosedResourceError`` instead (it means the same there).
"""

from __future__ import annotations

from typing import Final

from .._errors import SubagentsError

__all__ = ["REASONS", "StoreError"]

REASONS: Final = {
    "not_sqlite": "the file is not a SQLite database",
    "not_a_store": "the file is a SQLite database of another application",
    "truncated": "the file is shorter than its own header says",
    "newer_schema": "the store was written by a newer version of subagents",
    "unwritable": "the file or its directory cannot be written",
    "locked": "another connection held the write lock for longer than busy_timeout",
    "corrupt": "the database is damaged",
    "failed": "SQLite reported an error (disk full, I/O error, ...)",
}
"""Every ``StoreError.reason``, with what it means."""


class StoreError(SubagentsError):
    """The store at :attr:`path` cannot do what was asked.

    When raised while opening a store, the file was left as it was: nothing is created,
    migrated or converted to WAL before the checks pass.

    Attributes:
        path: the store's file.
        reason: one of :data:`REASONS` (``not_sqlite``, ``not_a_store``, ``truncated``,
            ``newer_schema``, ``unwritable``, ``locked``, ``corrupt``, ``failed``).
        detail: what was found, in a sentence.
    """

    def __init__(self, path: str, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown StoreError reason {reason!r}")
        self.path = path
        self.reason = reason
        self.detail = detail
        super().__init__(f"store {path!r}: {detail}")
