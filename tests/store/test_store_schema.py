"""The schema a new store gets, and the rules it enforces whoever writes to the file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from subagents.store import APPLICATION_ID, SCHEMA_VERSION, SqliteStore
from subagents.store._schema import MIGRATIONS

TABLES = {"schema_version", "tasks", "names", "envelopes", "deliveries"} | {
    f"room_{name}"
    for name in (
        "members",
        "memberships",
        "tags",
        "caps",
        "messages",
        "message_rooms",
        "deliveries",
        "leases",
        "lease_spans",
        "reads",
    )
}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    path = tmp_path / "store.db"

    async def create() -> None:
        async with SqliteStore(path):
            pass

    anyio.run(create)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    yield conn
    conn.close()


def one(conn: sqlite3.Connection, sql: str) -> object:
    ((value,),) = conn.execute(sql).fetchall()
    return value


def test_a_new_store_has_the_whole_schema(db: sqlite3.Connection, tmp_path: Path) -> None:
    assert one(db, "PRAGMA application_id") == APPLICATION_ID
    assert one(db, "PRAGMA user_version") == SCHEMA_VERSION
    assert one(db, "PRAGMA journal_mode") == "wal"
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_schema WHERE type='table'")}
    assert tables - {"sqlite_sequence"} == TABLES
    versions = db.execute("SELECT version, description FROM schema_version").fetchall()
    assert versions == [(m.version, m.description) for m in MIGRATIONS]
    # The header on disk already says so (the next opener reads it before SQLite does).
    header = (tmp_path / "store.db").read_bytes()[:100]
    assert int.from_bytes(header[68:72], "big") == APPLICATION_ID
    assert int.from_bytes(header[60:64], "big") == SCHEMA_VERSION


def test_reopening_migrates_nothing(db: sqlite3.Connection, tmp_path: Path) -> None:
    async def reopen() -> None:
        async with SqliteStore(tmp_path / "store.db"):
            pass

    anyio.run(reopen)
    assert one(db, "SELECT count(*) FROM schema_version") == len(MIGRATIONS)


def deliver(
    conn: sqlite3.Connection, task_id: str, stored_at: float = 0.0, expires_at: float | None = None
) -> int:
    """Insert an envelope and its delivery as a put would; the envelope's id."""
    envelope = conn.execute(
        "INSERT INTO envelopes (session, task_id, body, created_ms) VALUES ('s', ?, '{}', 0)",
        (task_id,),
    ).lastrowid
    conn.execute(
        "INSERT INTO deliveries (envelope_id, session, task_id, stored_at, expires_at, origin, "
        "changed_ms) VALUES (?, 's', ?, ?, ?, 'test', 0)",
        (envelope, task_id, stored_at, expires_at),
    )
    return int(envelope or 0)


def test_a_delivery_state_only_moves_forward(db: sqlite3.Connection) -> None:
    deliver(db, "a")
    deliver(db, "c")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        db.execute("UPDATE deliveries SET state = 'offered' WHERE task_id = 'c'")
    db.execute("UPDATE deliveries SET state = 'read' WHERE task_id = 'a'")
    for back in ("stored", "expired", "replaced"):
        with pytest.raises(sqlite3.IntegrityError, match="only moves forward"):
            db.execute("UPDATE deliveries SET state = ? WHERE task_id = 'a'", (back,))


def test_a_put_retires_the_unread_row_of_its_key(db: sqlite3.Connection) -> None:
    deliver(db, "a")
    deliver(db, "a")  # replaced, whoever writes
    deliver(db, "b", stored_at=0.0, expires_at=5.0)
    deliver(db, "b", stored_at=9.0)  # the first b had expired when this one came
    rows = db.execute("SELECT task_id, state FROM deliveries ORDER BY id").fetchall()
    assert rows == [("a", "replaced"), ("a", "stored"), ("b", "expired"), ("b", "stored")]
    # At most one unread row per key, even when the trigger is bypassed.
    db.execute("DROP TRIGGER deliveries_overwrite")
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        deliver(db, "a")


def test_deleting_an_envelope_deletes_its_deliveries(db: sqlite3.Connection) -> None:
    envelope = deliver(db, "a")
    db.execute("DELETE FROM envelopes WHERE id = ?", (envelope,))
    assert one(db, "SELECT count(*) FROM deliveries") == 0


def test_the_journal_tables_enforce_their_rules(db: sqlite3.Connection) -> None:
    def spawn(task_id: str, key: str | None, session: str = "s") -> None:
        db.execute(
            "INSERT INTO tasks (task_id, session, agent, agent_path, request, idempotency_key, "
            "created_ms, updated_ms) VALUES (?, ?, 'general', '/root/general', '{}', ?, 0, 0)",
            (task_id, session, key),
        )

    spawn("t1", "key")
    spawn("t2", None)
    spawn("t3", None)  # many spawns without a key
    spawn("t4", "key", session="other")  # a key is per session
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        spawn("t5", "key")
    db.execute("UPDATE tasks SET state = 'running', attempts = 1 WHERE task_id = 't1'")
    db.execute("UPDATE tasks SET state = 'ended' WHERE task_id = 't1'")
    with pytest.raises(sqlite3.IntegrityError, match="stays ended"):
        db.execute("UPDATE tasks SET state = 'running' WHERE task_id = 't1'")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        db.execute("UPDATE tasks SET state = 'lost' WHERE task_id = 't2'")
    db.execute("INSERT INTO names VALUES ('s', '/root/general', 't1')")
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        db.execute("INSERT INTO names VALUES ('s', '/root/general', 't2')")


def test_a_version_1_store_gains_the_index_of_tasks_by_envelope(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    for statement in MIGRATIONS[0].statements:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1, 0, 'the whole schema')")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.close()

    async def reopen() -> None:
        async with SqliteStore(path):
            pass

    anyio.run(reopen)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert one(conn, "PRAGMA user_version") == SCHEMA_VERSION
        versions = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert versions == [(m.version,) for m in MIGRATIONS]
        indexes = conn.execute("SELECT name FROM pragma_index_list('tasks')").fetchall()
        assert ("tasks_envelope",) in indexes
    finally:
        conn.close()
