"""What the ``subagents store`` command does to a store's file: count its rows
(:func:`status`), stream its envelopes (:func:`export`), compact it (:func:`vacuum`).

``status`` and ``export`` only read, through :class:`._readonly.ReadOnlyStore`:
``status`` in one short read transaction (its counts are of one snapshot), ``export`` one
statement per page, so that no read transaction outlives a page and a live store's
checkpoints go on during a long export. ``vacuum`` writes, and gives up after its busy
timeout rather than wait for a lock another process holds.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Generator
from pathlib import Path
from typing import Final

import attrs

from .._json import JSONValue, dumps, loads
from ._errors import StoreError
from ._files import check_existing
from ._readonly import ReadOnlyStore
from ._schema import SCHEMA_VERSION, current_version
from ._sqlite import translate

__all__ = [
    "DELIVERY_STATES",
    "EXPORT_CHUNK",
    "TASK_STATES",
    "Sizes",
    "StoreStatus",
    "export",
    "status",
    "vacuum",
]

TASK_STATES: Final = ("queued", "running", "ended")
"""``tasks.state``, in the order they come."""
DELIVERY_STATES: Final = ("stored", "read", "expired", "replaced")
"""``deliveries.state``: ``stored`` (unread) first, then the three it may become."""
EXPORT_CHUNK: Final = 1000
"""Lines :func:`export` reads per statement."""


@attrs.frozen(kw_only=True)
class Sizes:
    """Bytes on disk of a store."""

    db: int
    """The main file."""
    wal: int
    """The ``-wal`` file beside it (0 when there is none)."""

    @property
    def total(self) -> int:
        """Both files."""
        return self.db + self.wal

    @classmethod
    def of(cls, path: Path) -> Sizes:
        """The sizes now; a file that is not there counts 0."""
        return cls(db=_size(path), wal=_size(path.parent / f"{path.name}-wal"))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@attrs.frozen(kw_only=True)
class StoreStatus:
    """What ``subagents store status`` reports."""

    path: str
    """The store's file, as given."""
    sizes: Sizes
    """Bytes on disk."""
    schema_version: int
    """The version the store's ``schema_version`` table records."""
    application_id: int
    """``PRAGMA application_id``: a store's :data:`._files.APPLICATION_ID` (the checks
    refuse any other)."""
    tasks: dict[str, int]
    """Journaled spawns by state (every one of :data:`TASK_STATES`)."""
    deliveries: dict[str, int]
    """Delivery rows by state (every one of :data:`DELIVERY_STATES`)."""
    envelopes: int
    """Envelope rows."""
    sessions: int
    """Sessions with a journaled spawn or a delivery."""

    def to_dict(self) -> dict[str, JSONValue]:
        """A JSON-ready dict (``subagents store status --json``)."""
        return {
            "path": self.path,
            "bytes": {"db": self.sizes.db, "wal": self.sizes.wal, "total": self.sizes.total},
            "schema_version": self.schema_version,
            "schema_supported": SCHEMA_VERSION,
            "application_id": self.application_id,
            "sessions": self.sessions,
            "tasks": dict(self.tasks),
            "envelopes": self.envelopes,
            "deliveries": dict(self.deliveries),
        }


def status(path: str | os.PathLike[str], *, busy_timeout: float) -> StoreStatus:
    """Count the rows of the store at ``path``, changing nothing on disk. Blocking.

    The counts are of one snapshot (one read transaction, as long as the counting). The
    unfinished tasks and the unread deliveries are counted from their partial indexes;
    the totals from the smallest index of each table; the split of retired deliveries
    (read, expired, replaced) and the sessions read the deliveries table whole (no index
    keeps them), a fraction of a second per million rows.

    Raises:
        StoreError: the file is not a readable store.
    """
    with ReadOnlyStore(path, busy_timeout=busy_timeout) as store:
        return store.read(lambda conn: _count(conn, store))


def _count(conn: sqlite3.Connection, store: ReadOnlyStore) -> StoreStatus:
    def one(sql: str) -> int:
        ((value,),) = conn.execute(sql).fetchall()
        return int(value)

    def by_state(sql: str, states: tuple[str, ...]) -> dict[str, int]:
        found = {str(state): int(n) for state, n in conn.execute(sql).fetchall()}
        return {state: found.get(state, 0) for state in states}

    conn.execute("BEGIN")
    try:
        tasks = by_state(
            "SELECT state, count(*) FROM tasks INDEXED BY tasks_unfinished "
            "WHERE state <> 'ended' GROUP BY state",
            TASK_STATES,
        )
        tasks["ended"] = one("SELECT count(*) FROM tasks") - sum(tasks.values())
        deliveries = by_state(
            "SELECT state, count(*) FROM deliveries WHERE state <> 'stored' GROUP BY state",
            DELIVERY_STATES,
        )
        deliveries["stored"] = one(
            "SELECT count(*) FROM deliveries INDEXED BY deliveries_live WHERE state = 'stored'"
        )
        return StoreStatus(
            path=store.where,
            sizes=Sizes.of(store.path),
            schema_version=store.schema_version,
            application_id=one("PRAGMA application_id"),
            tasks=tasks,
            deliveries=deliveries,
            envelopes=one("SELECT count(*) FROM envelopes"),
            sessions=one(
                "SELECT count(*) FROM "
                "(SELECT session FROM names UNION SELECT session FROM deliveries)"
            ),
        )
    finally:
        conn.execute("COMMIT")


# ---------------------------------------------------------------- export

# Every envelope with each of its deliveries (or none: an envelope the journal wrote for a
# child whose mailbox never got it), in envelope order; the page key is the pair of ids.
_ALL: Final = """
SELECT e.id, e.session, e.task_id, d.recipient, d.state, e.body, d.id
FROM envelopes AS e LEFT JOIN deliveries AS d ON d.envelope_id = e.id
WHERE e.id >= :envelope AND (e.id > :envelope OR d.id > :delivery) {session}
ORDER BY e.id, d.id LIMIT :limit
"""
# The unread deliveries, from their partial unique index, in its order (session,
# recipient, task id); the page key is the index's key (without the session when one is
# asked for, so that the range starts inside it).
_UNREAD: Final = """
SELECT e.id, d.session, d.task_id, d.recipient, d.state, e.body, d.id
FROM deliveries AS d INDEXED BY deliveries_unread JOIN envelopes AS e ON e.id = d.envelope_id
WHERE d.state = 'stored' AND {key}
ORDER BY d.session, d.recipient, d.task_id LIMIT :limit
"""
_ALL_KEY: Final = "(d.session, d.recipient, d.task_id) > (:session_after, :recipient, :task)"
_SESSION_KEY: Final = "d.session = :session AND (d.recipient, d.task_id) > (:recipient, :task)"

_Row = tuple[int, str, str, str | None, str | None, bytes, int | None]
"""Envelope id, session, task id, recipient, state, body, delivery id."""


def export(
    path: str | os.PathLike[str],
    *,
    session: str | None = None,
    unread: bool = False,
    busy_timeout: float,
    chunk: int = EXPORT_CHUNK,
) -> Generator[bytes, None, None]:
    """One JSON line (no newline) per delivery of each envelope of the store at ``path``,
    read ``chunk`` rows per statement (memory bounded by the chunk, not the store).
    Changes nothing on disk. Blocking.

    Each line is ``{"session", "task_id", "envelope_id", "recipient", "state",
    "envelope"}``: ``envelope`` is the ``DelegateResult`` as ``to_dict`` gives it;
    ``state`` is the delivery's (``stored`` = unread), and ``recipient`` and ``state`` are
    ``null`` for an envelope with no delivery row. ``session`` keeps one session's rows;
    ``unread`` only deliveries still ``stored`` (a row past its TTL stays ``stored``
    until a write meets it). Rows committed while it runs may or may not be included;
    none is given twice.

    Raises:
        StoreError: the file is not a readable store, or an envelope is not JSON.
    """
    with ReadOnlyStore(path, busy_timeout=busy_timeout) as store:
        params: dict[str, object] = {"limit": chunk, "session": session}
        if unread:
            sql = _UNREAD.format(key=_ALL_KEY if session is None else _SESSION_KEY)
            params.update(session_after="", recipient="", task="")
        else:
            sql = _ALL.format(session="AND e.session = :session" if session is not None else "")
            params.update(envelope=0, delivery=0)
        while True:
            rows: list[_Row] = store.read(lambda conn: conn.execute(sql, params).fetchall())
            for row in rows:
                yield _line(store.where, row)
            if len(rows) < chunk:
                return
            envelope_id, last_session, task_id, recipient, _, _, delivery_id = rows[-1]
            if unread:
                params.update(session_after=last_session, recipient=recipient, task=task_id)
            else:
                params.update(envelope=envelope_id, delivery=delivery_id or 0)


def _line(where: str, row: _Row) -> bytes:
    envelope_id, session, task_id, recipient, state, body, _ = row
    try:
        envelope = loads(body)
    except ValueError as exc:
        raise StoreError(where, "corrupt", f"envelope {envelope_id} is not JSON: {exc}") from exc
    if not isinstance(envelope, dict):
        raise StoreError(where, "corrupt", f"envelope {envelope_id} is not a JSON object")
    return dumps(
        {
            "session": session,
            "task_id": task_id,
            "envelope_id": envelope_id,
            "recipient": recipient,
            "state": state,
            "envelope": envelope,
        }
    )


# ---------------------------------------------------------------- vacuum


def vacuum(path: str | os.PathLike[str], *, busy_timeout: float) -> tuple[Sizes, Sizes]:
    """Checkpoint the WAL into the file (``TRUNCATE``), ``VACUUM``, checkpoint again;
    returns the sizes before and after. Blocking, for up to about twice ``busy_timeout``
    while another connection holds the database; safe while other processes have the
    store open (SQLite's own locking).

    Raises:
        StoreError: ``locked`` when another connection held a transaction for longer
            than ``busy_timeout`` (nothing was vacuumed), or the file is not a store.
    """
    where, file = str(path), Path(path)
    check_existing(file, SCHEMA_VERSION)
    before = Sizes.of(file)
    conn = sqlite3.connect(file, timeout=busy_timeout, isolation_level=None)
    try:
        if current_version(conn, where) == 0:
            raise StoreError(where, "not_a_store", "no store here: an empty database")
        _checkpoint(conn, where, busy_timeout)
        conn.execute("VACUUM")
        # The vacuumed pages are in the WAL: copy them into the (now shorter) file. A
        # writer that came in between leaves that to the store's next checkpoint.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except sqlite3.Error as exc:
        error = translate(exc, where)
        if error.reason == "locked":
            raise _locked(where, busy_timeout) from exc
        raise error from exc
    finally:
        conn.close()
    return before, Sizes.of(file)


def _checkpoint(conn: sqlite3.Connection, where: str, busy_timeout: float) -> None:
    ((busy, _, _),) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    if busy:
        raise _locked(where, busy_timeout)


def _locked(where: str, busy_timeout: float) -> StoreError:
    return StoreError(
        where,
        "locked",
        f"another connection held the database for over {busy_timeout:g} s (the busy "
        f"timeout); nothing was vacuumed: try again when it is idle",
    )
