"""The journal of spawns in the store: the engine's :class:`~subagents._journal.Journal`.

Every journal write is a :class:`~._writer.Write` in the writer thread's one queue, so it
is group-committed with the mailboxes' puts and applied in order with them: a child's
envelope put (by its session's mailbox) comes before its ``ended`` write, which links the
row the mailbox wrote instead of writing the envelope again.

Recovery runs as one write too: inside one ``BEGIN IMMEDIATE`` transaction, every task not
``ended`` whose owning process is gone gets its envelope (the one already written, if the
process died between the put and the ``ended`` write; else a new ``Interrupted`` one,
delivered to its session's mailbox) and becomes ``ended``: exactly one envelope each, even
with several processes recovering at once.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, Self, cast

import attrs

from .._envelope import DelegateResult, Status, now_ms
from .._journal import KeyedTask, SpawnEntry, StoredTask
from .._json import JSONValue, dumps, loads
from . import _deliveries as rows
from ._writer import Write

__all__ = ["INTERRUPTED", "OPEN_ORIGINS", "SqliteJournal"]

INTERRUPTED: Final = "Interrupted"
"""The ``error_type`` of the envelope a restart gives a spawn its process never ended."""

_INTERRUPTED_TEXT: Final = (
    "the process running this child ended before the child finished "
    "(its envelope was given by a restart)"
)

OPEN_ORIGINS: set[str] = set()
"""The origins of the stores open in this process: their tasks are not recovered."""

# A plain INSERT: an id the store holds already fails the batch loudly, never silently
# (spawn checks the store first, so only a race with another process could clash). An
# idempotency key another row holds is not a failure: two processes that both found the
# key free spawned at once, and the later row is written without it (design/store.md).
_INSERT_TASK: Final = (
    "INSERT INTO tasks (task_id, session, parent_task, agent, agent_path, request, "
    "idempotency_key, state, attempts, owner, created_ms, updated_ms) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?7 IS NULL THEN NULL "
    "WHEN EXISTS (SELECT 1 FROM tasks WHERE session = ?2 AND idempotency_key = ?7) "
    "THEN NULL ELSE ?7 END, 'queued', 0, ?8, ?9, ?9)"
)
# A key is free again once its task is forgotten (its envelope unlinked), or, for a task
# this store journaled, once its record is dropped here (a spawn with the key found none).
_RELEASE_KEY: Final = (
    "UPDATE tasks SET idempotency_key = NULL WHERE session = ? AND idempotency_key = ? "
    "AND state = 'ended' AND (envelope_id IS NULL OR owner = ?)"
)
_INSERT_NAME: Final = "INSERT OR IGNORE INTO names (session, agent_path, task_id) VALUES (?, ?, ?)"
_LAST_ENVELOPE: Final = "SELECT max(id) FROM envelopes WHERE task_id = ?"
_END: Final = (
    "UPDATE tasks SET state = 'ended', envelope_id = ?, updated_ms = ? "
    "WHERE task_id = ? AND state <> 'ended'"
)


def owner_alive(owner: str | None) -> bool:
    """Whether the process (and store) that journaled a task may still run it: a store
    open in this process, or another process that exists. A pid reused by an unrelated
    process keeps its tasks unrecovered until that process ends."""
    if not owner:
        return False
    if owner in OPEN_ORIGINS:
        return True
    pid_text, _, _ = owner.partition("-")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid == os.getpid():
        return False  # this process, but that store is closed
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # it exists (another user's)
    except (OSError, OverflowError, ValueError):
        return False
    return True


class _SpawnWrite(Write):
    __slots__ = ("entry", "owner")

    def __init__(self, entry: SpawnEntry, owner: str) -> None:
        super().__init__()
        self.entry = entry
        self.owner = owner

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ms = now_ms()
        keyed = [w for w in writes if w.entry.idempotency_key is not None]
        if keyed:
            conn.executemany(
                _RELEASE_KEY,
                [(w.entry.session_id, w.entry.idempotency_key, w.owner) for w in keyed],
            )
        conn.executemany(
            _INSERT_TASK,
            [
                (
                    e.task_id,
                    e.session_id,
                    e.parent_task,
                    e.agent,
                    e.agent_path,
                    dumps(e.request),
                    e.idempotency_key,
                    w.owner,
                    ms,
                )
                for w in writes
                for e in (w.entry,)
            ],
        )
        conn.executemany(
            _INSERT_NAME,
            [(w.entry.session_id, w.entry.agent_path, w.entry.task_id) for w in writes],
        )


class _StartWrite(Write):
    __slots__ = ("task_id",)

    def __init__(self, task_id: str) -> None:
        super().__init__()
        self.task_id = task_id

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ms = now_ms()
        conn.executemany(
            "UPDATE tasks SET state = 'running', attempts = attempts + 1, updated_ms = ? "
            "WHERE task_id = ? AND state = 'queued'",
            [(ms, w.task_id) for w in writes],
        )


def _insert_envelope(conn: sqlite3.Connection, session: str, task_id: str, body: bytes) -> int:
    """An envelope row with no delivery (no mailbox wrote it); returns its id."""
    ((largest,),) = conn.execute("SELECT coalesce(max(id), 0) FROM envelopes").fetchall()
    envelope_id = int(largest) + 1
    conn.execute(
        "INSERT INTO envelopes (id, session, task_id, body, created_ms) VALUES (?, ?, ?, ?, ?)",
        (envelope_id, session, task_id, body, now_ms()),
    )
    return envelope_id


class _EndWrite(Write):
    __slots__ = ("deliver", "envelope", "origin", "session", "task_id")

    def __init__(
        self, task_id: str, session: str, envelope: DelegateResult, deliver: bool, origin: str
    ) -> None:
        super().__init__()
        self.task_id = task_id
        self.session = session
        self.envelope = envelope
        self.deliver = deliver
        self.origin = origin

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ms = now_ms()
        for w in writes:
            ((envelope_id,),) = conn.execute(_LAST_ENVELOPE, (w.task_id,)).fetchall()
            if envelope_id is None and w.deliver:  # ended as its manager closed
                envelope_id = _deliver(conn, w.session, w.task_id, w.envelope, w.origin, ms)
            elif envelope_id is None:  # its mailbox did not write it (full, closed)
                envelope_id = _insert_envelope(conn, w.session, w.task_id, w.envelope.to_json())
            conn.execute(_END, (envelope_id, ms, w.task_id))


class _ForgetWrite(Write):
    """A forgotten task: ended, its envelope unlinked, so no lookup restores it."""

    __slots__ = ("pending", "task_id")

    def __init__(self, task_id: str, pending: set[str]) -> None:
        super().__init__()
        self.task_id = task_id
        self.pending = pending  # forgotten, not yet committed: lookup answers None

    def done(self) -> None:
        self.pending.discard(self.task_id)

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ms = now_ms()
        conn.executemany(
            "UPDATE tasks SET envelope_id = NULL, updated_ms = ? "
            "WHERE task_id = ? AND state = 'ended'",
            [(ms, w.task_id) for w in writes],
        )


@attrs.define(kw_only=True)
class _Undelivered:
    """An envelope no mailbox put (a recovered task's, or one ended as its manager closed),
    as :func:`._deliveries.insert` writes it."""

    session: str
    task_id: str
    body: bytes
    stored_at: float
    origin: str
    recipient: str = ""
    expires_at: float | None = None
    claimed: bool = False


def interrupted_envelope(task_id: str, agent: str, agent_path: str) -> DelegateResult:
    """The envelope of a spawn whose process ended before it did."""
    parent_path, _, _ = agent_path.rpartition("/")
    return DelegateResult(
        agent=agent,
        task_id=task_id,
        status=Status.ERROR,
        error=_INTERRUPTED_TEXT,
        error_type=INTERRUPTED,
        agent_path=agent_path,
        parent_path=parent_path,
    )


def _deliver(
    conn: sqlite3.Connection,
    session: str,
    task_id: str,
    envelope: DelegateResult,
    origin: str,
    ms: int,
) -> int:
    """Put ``envelope`` unread in ``session``'s durable mailbox; returns its row's id."""
    entry = _Undelivered(
        session=session,
        task_id=task_id,
        body=envelope.to_json(),
        stored_at=time.time(),
        origin=origin,
    )
    rows.insert(conn, [entry], ms)
    ((envelope_id,),) = conn.execute(_LAST_ENVELOPE, (task_id,)).fetchall()
    return int(envelope_id)


class _RecoverWrite(Write):
    __slots__ = ("origin", "recovered")

    def __init__(self, origin: str) -> None:
        super().__init__()
        self.origin = origin
        self.recovered = 0

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        for w in writes:
            w.recovered = _recover(conn, w.origin)


def _recover(conn: sqlite3.Connection, origin: str) -> int:
    """Finish every unfinished task of a process that has ended; returns how many."""
    unfinished = conn.execute(
        "SELECT task_id, session, agent, agent_path, owner FROM tasks "
        "INDEXED BY tasks_unfinished WHERE state <> 'ended'"
    ).fetchall()
    ms = now_ms()
    recovered = 0
    for task_id, session, agent, agent_path, owner in unfinished:
        if owner_alive(owner):
            continue
        ((envelope_id,),) = conn.execute(_LAST_ENVELOPE, (task_id,)).fetchall()
        if envelope_id is None:  # the usual case: it never ended
            envelope = interrupted_envelope(task_id, agent, agent_path)
            envelope_id = _deliver(conn, session, task_id, envelope, origin, ms)
        conn.execute(_END, (envelope_id, ms, task_id))
        recovered += 1
    return recovered


_LOOKUP: Final = (
    "SELECT t.session, t.request, e.id, e.body FROM tasks t "
    "JOIN envelopes e ON e.id = t.envelope_id WHERE t.task_id = ? AND t.state = 'ended' "
    "AND t.owner IS NOT ?"
)
_TAKEN: Final = (
    "SELECT 1 FROM tasks WHERE task_id = ? UNION ALL "
    "SELECT 1 FROM envelopes INDEXED BY envelopes_task WHERE task_id = ? LIMIT 1"
)
_UNREAD: Final = "SELECT 1 FROM deliveries WHERE envelope_id = ? AND state = 'stored' LIMIT 1"
_BY_KEY: Final = (
    "SELECT task_id, state, owner, envelope_id FROM tasks INDEXED BY tasks_idempotency "
    "WHERE session = ? AND idempotency_key = ? AND owner IS NOT ?"
)

Read = Callable[[Callable[[sqlite3.Connection], object]], object]


class SqliteJournal:
    """The journal of one :class:`~subagents.store.SqliteStore` (see the module docstring).

    Made by :meth:`SqliteStore.journal`; its writes go through the store's writer thread,
    its reads through the event loop's connection (one indexed statement each).
    """

    def __init__(
        self,
        *,
        origin: str,
        submit: Callable[[Write], int],
        read: Read,
        wait_committed: Callable[[int], Awaitable[None]],
        decode: Callable[[bytes], DelegateResult],
    ) -> None:
        self._origin = origin
        self._submit = submit
        self._read = read
        self._wait = wait_committed
        self._decode = decode
        self._forgetting: set[str] = set()

    def spawned(self, entry: SpawnEntry) -> int:
        """Queue the spawn's ``tasks`` and ``names`` rows; returns the write's sequence
        number (what :meth:`wait_journaled` waits for). Never blocks."""
        return self._submit(_SpawnWrite(entry, self._origin))

    def started(self, task_id: str) -> None:
        """Queue: the task is ``running`` (``attempts + 1``). Never blocks."""
        self._submit(_StartWrite(task_id))

    def ended(
        self, task_id: str, session_id: str, envelope: DelegateResult, deliver: bool = False
    ) -> None:
        """Queue: the task is ``ended``, linked to the envelope row its mailbox wrote (or,
        if none did, to one written here: with ``deliver``, unread in the session's
        mailbox). Never blocks."""
        self._submit(_EndWrite(task_id, session_id, envelope, deliver, self._origin))

    def forgotten(self, task_id: str) -> None:
        """Queue: the ended task ``task_id`` was forgotten (its envelope is unlinked, so
        :meth:`lookup` no longer finds it, in any process). Never blocks."""
        self._submit(_ForgetWrite(task_id, self._forgetting))
        self._forgetting.add(task_id)

    def taken(self, task_id: str) -> bool:
        """Whether the store holds a task or an envelope of ``task_id`` (one indexed read
        each on the event loop's connection)."""

        def query(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(_TAKEN, (task_id, task_id)).fetchall())

        return bool(self._read(query))

    async def wait_journaled(self, token: int) -> None:
        """Block until the write ``token`` (and every one before it) is committed.

        Raises:
            StoreError: the store failed first.
        """
        await self._wait(token)

    def lookup(self, task_id: str) -> StoredTask | None:
        """The ended task ``task_id`` with its envelope, or ``None`` (two indexed reads on
        the event loop's connection). A task this store journaled itself is ``None``: its
        record is this process's own (kept, or forgotten on purpose), never restored."""

        if task_id in self._forgetting:
            return None

        def query(conn: sqlite3.Connection) -> StoredTask | None:
            found = conn.execute(_LOOKUP, (task_id, self._origin)).fetchall()
            if not found:
                return None
            ((session, request, envelope_id, body),) = found
            unread = bool(conn.execute(_UNREAD, (envelope_id,)).fetchall())
            data = loads(request)
            return StoredTask(
                task_id=task_id,
                session_id=str(session),
                request=cast("Mapping[str, JSONValue]", data if isinstance(data, dict) else {}),
                envelope=self._decode(bytes(body)),
                unread=unread,
            )

        return cast("StoredTask | None", self._read(query))

    def by_key(self, session_id: str, key: str) -> KeyedTask | None:
        """The task another store journaled in ``session_id`` with idempotency key ``key``,
        or ``None`` (one read of the ``tasks_idempotency`` index on the event loop's
        connection). A forgotten task (its envelope unlinked, or its forgetting queued
        here) holds no key; nor does a task this store journaled, as for :meth:`lookup`."""

        def query(conn: sqlite3.Connection) -> KeyedTask | None:
            found = conn.execute(_BY_KEY, (session_id, key, self._origin)).fetchall()
            if not found:
                return None
            ((task_id, state, owner, envelope_id),) = found
            ended = state == "ended"
            if (ended and envelope_id is None) or task_id in self._forgetting:
                return None
            alive = not ended and owner_alive(None if owner is None else str(owner))
            return KeyedTask(task_id=str(task_id), ended=ended, owner_alive=alive)

        return cast("KeyedTask | None", self._read(query))

    def names(self, session_id: str) -> list[str]:
        """Every agent path ``session_id`` was given in this store (its ``names`` rows)."""

        def query(conn: sqlite3.Connection) -> list[str]:
            found = conn.execute(
                "SELECT agent_path FROM names WHERE session = ?", (session_id,)
            ).fetchall()
            return [str(path) for (path,) in found]

        return cast("list[str]", self._read(query))

    async def recover(self) -> int:
        """Give each unfinished task of an ended process its one envelope, in one
        transaction of the writer thread; returns how many were finished. Blocks until
        committed; cancellation stops the wait, not the write."""
        write = _RecoverWrite(self._origin)
        await self._wait(self._submit(write))
        return write.recovered
