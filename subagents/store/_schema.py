"""The store's tables, and the migrations that build them.

Version 1 creates every table the durable store needs, the mailbox's and the journal's
(spawns, names, idempotency); version 2 adds the index that deleting a forgotten task's
envelopes needs; version 3 adds the tables of ``subagents.room`` (``design/room.md``).
``design/store.md`` explains each table and column.

A migration is a list of statements applied inside the caller's ``BEGIN IMMEDIATE``
transaction (not ``executescript``, which commits whatever transaction is open).
"""

from __future__ import annotations

import sqlite3
from typing import Final

import attrs

from .._envelope import now_ms
from ._errors import StoreError
from ._files import APPLICATION_ID

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "current_version", "migrate"]


@attrs.frozen(kw_only=True)
class Migration:
    """The statements that take a store from ``version - 1`` to ``version``."""

    version: int
    description: str
    statements: tuple[str, ...]


_V1: Final = (
    """CREATE TABLE schema_version (
        version     INTEGER PRIMARY KEY,
        applied_ms  INTEGER NOT NULL,
        description TEXT NOT NULL
    )""",
    # The journal of spawns (filled once the engine writes to it).
    """CREATE TABLE tasks (
        task_id         TEXT PRIMARY KEY,
        session         TEXT NOT NULL,
        parent_task     TEXT,
        agent           TEXT NOT NULL,
        agent_path      TEXT NOT NULL,
        request         BLOB NOT NULL,
        idempotency_key TEXT,
        state           TEXT NOT NULL DEFAULT 'queued'
                        CHECK (state IN ('queued', 'running', 'ended')),
        attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        owner           TEXT,
        envelope_id     INTEGER REFERENCES envelopes (id),
        created_ms      INTEGER NOT NULL,
        updated_ms      INTEGER NOT NULL
    )""",
    """CREATE UNIQUE INDEX tasks_idempotency ON tasks (session, idempotency_key)
        WHERE idempotency_key IS NOT NULL""",
    "CREATE INDEX tasks_unfinished ON tasks (session) WHERE state <> 'ended'",
    """CREATE TRIGGER tasks_ended_is_final BEFORE UPDATE OF state ON tasks
        WHEN OLD.state = 'ended' AND NEW.state <> 'ended'
        BEGIN SELECT RAISE(ABORT, 'an ended task stays ended'); END""",
    # Every agent path a session handed out: naming goes on from them after a restart.
    """CREATE TABLE names (
        session    TEXT NOT NULL,
        agent_path TEXT NOT NULL,
        task_id    TEXT NOT NULL,
        PRIMARY KEY (session, agent_path)
    ) WITHOUT ROWID""",
    # One row per envelope put: the body, written once.
    """CREATE TABLE envelopes (
        id         INTEGER PRIMARY KEY,
        session    TEXT NOT NULL,
        task_id    TEXT NOT NULL,
        body       BLOB NOT NULL,
        created_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX envelopes_task ON envelopes (task_id)",
    # One row per (envelope, recipient); ``id`` is the arrival order and never reused.
    """CREATE TABLE deliveries (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        envelope_id INTEGER NOT NULL REFERENCES envelopes (id) ON DELETE CASCADE,
        session     TEXT NOT NULL,
        recipient   TEXT NOT NULL DEFAULT '',
        task_id     TEXT NOT NULL,
        state       TEXT NOT NULL DEFAULT 'stored'
                    CHECK (state IN ('stored', 'read', 'expired', 'replaced')),
        stored_at   REAL NOT NULL,
        expires_at  REAL,
        origin      TEXT NOT NULL,
        consumer    TEXT,
        changed_ms  INTEGER NOT NULL
    )""",
    """CREATE UNIQUE INDEX deliveries_unread ON deliveries (session, recipient, task_id)
        WHERE state = 'stored'""",
    # Counting live entries (a put's capacity check) reads this index alone.
    """CREATE INDEX deliveries_live ON deliveries (session, recipient, expires_at)
        WHERE state = 'stored'""",
    "CREATE INDEX deliveries_envelope ON deliveries (envelope_id)",
    # A put overwrites: the unread row of the same key becomes 'replaced' ('expired' if
    # its TTL had passed when the new one was put), whoever inserts.
    """CREATE TRIGGER deliveries_overwrite BEFORE INSERT ON deliveries
        BEGIN UPDATE deliveries
            SET state = CASE WHEN expires_at IS NOT NULL AND expires_at <= NEW.stored_at
                        THEN 'expired' ELSE 'replaced' END,
                changed_ms = NEW.changed_ms
            WHERE session = NEW.session AND recipient = NEW.recipient
            AND task_id = NEW.task_id AND state = 'stored'; END""",
    """CREATE TRIGGER deliveries_forward_only BEFORE UPDATE OF state ON deliveries
        WHEN OLD.state <> 'stored'
        BEGIN SELECT RAISE(ABORT, 'a delivery state only moves forward'); END""",
)

_V2: Final = (
    # Deleting an envelope checks the foreign key from tasks.envelope_id: by this index,
    # not by a scan of every task (forget and retention delete a task's envelopes).
    "CREATE INDEX tasks_envelope ON tasks (envelope_id)",
)

_ROOM: Final = (
    # subagents.room (design/room.md): members of rooms, their messages with one delivery
    # row per recipient, file leases and read baselines. Times are the room's clock
    # (seconds); every request path reads these tables by an index.
    """CREATE TABLE room_members (
        member_id        TEXT PRIMARY KEY,
        harness_key      TEXT,
        label            TEXT NOT NULL DEFAULT '',
        tags             TEXT NOT NULL DEFAULT '[]',
        cwd              TEXT NOT NULL,
        pid              INTEGER,
        pid_start        INTEGER,
        autonomy         TEXT NOT NULL CHECK (autonomy IN ('wake', 'notify', 'hold')),
        joined_at        REAL NOT NULL,
        seen_at          REAL NOT NULL,
        deliveries_total INTEGER NOT NULL DEFAULT 0,
        deliveries_read  INTEGER NOT NULL DEFAULT 0,
        last_delivery_at REAL
    ) WITHOUT ROWID""",
    """CREATE UNIQUE INDEX room_members_harness ON room_members (harness_key)
        WHERE harness_key IS NOT NULL""",
    "CREATE INDEX room_members_label ON room_members (label)",
    "CREATE INDEX room_members_seen ON room_members (seen_at)",
    """CREATE TABLE room_memberships (
        room      TEXT NOT NULL,
        member_id TEXT NOT NULL REFERENCES room_members (member_id) ON DELETE CASCADE,
        joined_at REAL NOT NULL,
        PRIMARY KEY (room, member_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX room_memberships_member ON room_memberships (member_id, room)",
    """CREATE TABLE room_tags (
        tag       TEXT NOT NULL,
        member_id TEXT NOT NULL REFERENCES room_members (member_id) ON DELETE CASCADE,
        PRIMARY KEY (tag, member_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX room_tags_member ON room_tags (member_id)",
    """CREATE TABLE room_caps (
        room     TEXT PRIMARY KEY,
        autonomy TEXT NOT NULL CHECK (autonomy IN ('wake', 'notify', 'hold'))
    ) WITHOUT ROWID""",
    """CREATE TABLE room_messages (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        sender     TEXT NOT NULL,
        selector   TEXT NOT NULL,
        subject    TEXT,
        body       TEXT NOT NULL,
        reply_to   INTEGER,
        created_at REAL NOT NULL,
        expires_at REAL,
        recipients INTEGER NOT NULL
    )""",
    "CREATE INDEX room_messages_sender ON room_messages (sender, id)",
    # One row per room the sender was in when it sent: what makes a room's history whole.
    """CREATE TABLE room_message_rooms (
        room       TEXT NOT NULL,
        message_id INTEGER NOT NULL REFERENCES room_messages (id) ON DELETE CASCADE,
        PRIMARY KEY (room, message_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX room_message_rooms_message ON room_message_rooms (message_id)",
    """CREATE TABLE room_deliveries (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        message_id INTEGER NOT NULL REFERENCES room_messages (id) ON DELETE CASCADE,
        recipient  TEXT NOT NULL,
        state      TEXT NOT NULL DEFAULT 'stored' CHECK (state IN ('stored', 'offered',
                   'accepted', 'read', 'acked', 'expired', 'undeliverable')),
        created_at REAL NOT NULL,
        expires_at REAL,
        offered_at REAL,
        signals    INTEGER NOT NULL DEFAULT 0,
        changed_at REAL NOT NULL,
        UNIQUE (message_id, recipient)
    )""",
    # A member's deliveries whose body is not taken yet, in arrival order.
    """CREATE INDEX room_deliveries_inbox ON room_deliveries (recipient, id)
        WHERE state IN ('stored', 'offered', 'accepted', 'undeliverable')""",
    "CREATE INDEX room_deliveries_recipient ON room_deliveries (recipient, state)",
    """CREATE INDEX room_deliveries_offered ON room_deliveries (offered_at)
        WHERE state = 'offered'""",
    # A member's untaken deliveries with a TTL, soonest first: expiry reads only those due.
    """CREATE INDEX room_deliveries_expiry ON room_deliveries (recipient, expires_at)
        WHERE state IN ('stored', 'offered', 'accepted', 'undeliverable')
        AND expires_at IS NOT NULL""",
    # Forward only: stored 0, offered and undeliverable 1, accepted 2, read 3, then acked
    # (from anything not final) or expired (only before the body was taken); both final.
    # Within rank 1 a delivery moves both ways: offered -> undeliverable when its member
    # can no longer be woken (lowered below wake, pruned), undeliverable -> offered when
    # it can again (back with a running process, or raised to wake): a signal tried again.
    """CREATE TRIGGER room_deliveries_forward_only BEFORE UPDATE OF state ON room_deliveries
        WHEN OLD.state IN ('acked', 'expired')
        OR (NEW.state = 'expired' AND OLD.state = 'read')
        OR (NEW.state NOT IN ('acked', 'expired')
            AND NOT (OLD.state IN ('offered', 'undeliverable')
                AND NEW.state IN ('offered', 'undeliverable') AND NEW.state <> OLD.state) AND
            (CASE NEW.state WHEN 'stored' THEN 0 WHEN 'offered' THEN 1
                WHEN 'undeliverable' THEN 1 WHEN 'accepted' THEN 2 ELSE 3 END)
            <= (CASE OLD.state WHEN 'stored' THEN 0 WHEN 'offered' THEN 1
                WHEN 'undeliverable' THEN 1 WHEN 'accepted' THEN 2 ELSE 3 END))
        BEGIN SELECT RAISE(ABORT, 'a room delivery state only moves forward'); END""",
    """CREATE TABLE room_leases (
        path       TEXT NOT NULL,
        member_id  TEXT NOT NULL REFERENCES room_members (member_id) ON DELETE CASCADE,
        mode       TEXT NOT NULL CHECK (mode IN ('exclusive', 'shared')),
        claimed_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        PRIMARY KEY (path, member_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX room_leases_member ON room_leases (member_id, path)",
    # Leases that ended (released or expired), kept a while for the drift check: a file
    # changed while another member held it is CRITICAL even after that lease ended.
    """CREATE TABLE room_lease_spans (
        path       TEXT NOT NULL,
        member_id  TEXT NOT NULL,
        mode       TEXT NOT NULL,
        claimed_at REAL NOT NULL,
        ended_at   REAL NOT NULL
    )""",
    "CREATE INDEX room_lease_spans_path ON room_lease_spans (path, ended_at)",
    """CREATE TABLE room_reads (
        member_id TEXT NOT NULL REFERENCES room_members (member_id) ON DELETE CASCADE,
        path      TEXT NOT NULL,
        sha256    TEXT NOT NULL,
        read_at   REAL NOT NULL,
        PRIMARY KEY (member_id, path)
    ) WITHOUT ROWID""",
)

MIGRATIONS: Final = (
    Migration(version=1, description="the whole schema", statements=_V1),
    Migration(version=2, description="tasks by envelope, for deletes", statements=_V2),
    Migration(version=3, description="rooms: members, messages, leases", statements=_ROOM),
)
SCHEMA_VERSION: Final = MIGRATIONS[-1].version
"""The schema version this code writes; a store with a higher one is refused."""


def _tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'").fetchall()
    return {str(name) for (name,) in rows}


def current_version(conn: sqlite3.Connection, path: str) -> int:
    """The schema version recorded in the store, 0 for an empty database.

    Raises:
        StoreError: ``not_a_store`` for a database with tables but another application id
            or no version, ``newer_schema`` past :data:`SCHEMA_VERSION`.
    """
    tables = _tables(conn)
    if not tables:
        return 0
    ((application_id,),) = conn.execute("PRAGMA application_id").fetchall()
    if application_id != APPLICATION_ID:
        raise StoreError(
            path,
            "not_a_store",
            f"not a subagents store: its application_id is {application_id:#x}, "
            f"a store's is {APPLICATION_ID:#x} (another program's database?)",
        )
    if "schema_version" not in tables:
        raise StoreError(path, "not_a_store", "not a subagents store: it has no schema_version")
    (version,) = conn.execute("SELECT max(version) FROM schema_version").fetchall()[0]
    if version is None:
        raise StoreError(path, "not_a_store", "not a subagents store: schema_version is empty")
    if version > SCHEMA_VERSION:
        raise StoreError(
            path,
            "newer_schema",
            f"the store has schema version {version}; this version of subagents reads up to "
            f"{SCHEMA_VERSION}: upgrade subagents to open it",
        )
    return int(version)


def migrate(conn: sqlite3.Connection, path: str) -> int:
    """Bring the store to :data:`SCHEMA_VERSION`; call inside ``BEGIN IMMEDIATE``.

    Returns the version found before migrating (0 for a new store).
    """
    found = current_version(conn, path)
    for migration in MIGRATIONS:
        if migration.version <= found:
            continue
        for statement in migration.statements:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_version (version, applied_ms, description) VALUES (?, ?, ?)",
            (migration.version, now_ms(), migration.description),
        )
    if found < SCHEMA_VERSION:
        # Header copies of the version, read by check_before_open without opening SQLite.
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return found
