"""The durable store: one SQLite file in WAL mode that a killed process loses nothing from
and several processes on one machine share (see ``design/store.md``).

``SqliteStore`` opens the file (group commit by one writer thread, cross-process wake-ups
by polling ``PRAGMA data_version`` while someone waits); ``SqliteStore.mailbox`` makes a
session's durable ``SqliteMailbox``, an implementation of :class:`~subagents.BaseMailbox`.
An edge of the core: it imports the core's records and delivery modules, never the engine,
and the core never imports it.
"""

from __future__ import annotations

from .._journal import set_store_opener
from ._errors import REASONS, StoreError
from ._files import APPLICATION_ID
from ._journal import SqliteJournal
from ._mailbox import SqliteMailbox
from ._recovery import INTERRUPTED
from ._schema import SCHEMA_VERSION
from ._sqlite import Synchronous
from ._store import DEFAULT_BUSY_TIMEOUT, DEFAULT_POLL_INTERVAL, SqliteStore, StoreStatistics

__all__ = [
    "APPLICATION_ID",
    "DEFAULT_BUSY_TIMEOUT",
    "DEFAULT_POLL_INTERVAL",
    "INTERRUPTED",
    "REASONS",
    "SCHEMA_VERSION",
    "SqliteJournal",
    "SqliteMailbox",
    "SqliteStore",
    "StoreError",
    "StoreStatistics",
    "Synchronous",
]

for _obj in (SqliteJournal, SqliteMailbox, SqliteStore, StoreError, StoreStatistics):
    _obj.__module__ = __name__
del _obj

set_store_opener(SqliteStore)  # SubagentConfig(store_path=...) opens one
