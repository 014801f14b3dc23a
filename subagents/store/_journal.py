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

import contextlib
import logging
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
from ._errors import StoreError
from ._writer import Write

__all__ = ["INTERRUPTED", "OPEN_ORIGINS", "SqliteJournal"]

logger = logging.getLogger("subagents.store")

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
_DELETE_TASK: Final = "DELETE FROM tasks WHERE task_id = ? AND state = 'ended'"
# Its deliveries go by the cascade; the foreign key from tasks.envelope_id is checked by
# the index tasks_envelope (without it every delete would scan the tasks).
_DELETE_ENVELOPES: Final = (
    "DELETE FROM envelopes WHERE task_id = ?1 "
    "AND NOT EXISTS (SELECT 1 FROM tasks WHERE task_id = ?1)"
)
_STATE: Final = "SELECT state, envelope_id FROM tasks WHERE task_id = ?"


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
    __slots__ = ("deliver", "envelope", "origin", "session", "task_id", "then")

    def __init__(
        self,
        task_id: str,
        session: str,
        envelope: DelegateResult,
        deliver: bool,
        origin: str,
        then: Callable[[], object] | None,
    ) -> None:
        super().__init__()
        self.task_id = task_id
        self.session = session
        self.envelope = envelope
        self.deliver = deliver
        self.origin = origin
        self.then = then

    def done(self) -> None:
        if self.then is not None:
            self.then()

    def failed(self) -> None:
        if self.then is not None:
            self.then()

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
    """A forgotten task's rows deleted: its ``tasks`` row, its envelopes and their
    deliveries (by the foreign key's cascade); its ``names`` row stays, so its name is
    never given out again. Only an ended task's: a forget that meets its task not ended
    (its end write queued behind it: forgotten by a subscriber of its completion, while
    it was being delivered) is submitted once more, after that write."""

    __slots__ = ("again", "pending", "submit", "task_id", "unended")

    def __init__(
        self, task_id: str, pending: set[str], submit: Callable[[Write], int], again: bool
    ) -> None:
        super().__init__()
        self.task_id = task_id
        self.pending = pending  # forgotten, not yet committed: lookup answers None
        self.submit = submit
        self.again = again
        self.unended = False

    def done(self) -> None:
        if self.unended and self.again:
            try:
                self.submit(_ForgetWrite(self.task_id, self.pending, self.submit, again=False))
                return
            except Exception:  # the store is closing or failed: the row stays
                logger.warning("forgetting task %s in the store failed", self.task_id)
        self.pending.discard(self.task_id)

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ids = [(w.task_id,) for w in writes]
        deleted = conn.executemany(_DELETE_TASK, ids).rowcount
        conn.executemany(_DELETE_ENVELOPES, ids)
        if deleted < len(writes):  # a task not ended yet (or never stored)
            for w in writes:
                w.unended = bool(conn.execute(_STATE, (w.task_id,)).fetchall())


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


def interrupted_envelope(
    task_id: str, agent: str, agent_path: str, *, tries: int | None = None
) -> DelegateResult:
    """The envelope of a spawn whose process ended before it did; ``tries``: the runs of a
    re-runnable spawn that all ended so (its cap reached)."""
    parent_path, _, _ = agent_path.rpartition("/")
    text = _INTERRUPTED_TEXT
    if tries is not None:
        text = (
            f"the processes running this child ended before it finished, {tries} times "
            "(its agent's max_attempts): it is not run again"
        )
    return DelegateResult(
        agent=agent,
        task_id=task_id,
        status=Status.ERROR,
        error=text,
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
    __slots__ = ("origin", "recovered", "rerun", "reruns")

    def __init__(self, origin: str, reruns: Mapping[str, int]) -> None:
        super().__init__()
        self.origin = origin
        self.reruns = reruns
        self.recovered = 0
        self.rerun: list[SpawnEntry] = []

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        for w in writes:
            w.recovered, w.rerun = _recover(conn, w.origin, w.reruns)


def _recover(
    conn: sqlite3.Connection, origin: str, reruns: Mapping[str, int]
) -> tuple[int, list[SpawnEntry]]:
    """Finish every unfinished task of a process that has ended, or claim it for running
    again (a root spawn of an agent in ``reruns``, under its cap of tries); returns how
    many were finished, and the claimed ones."""
    unfinished = conn.execute(
        "SELECT task_id, session, parent_task, agent, agent_path, request, attempts, owner, "
        "idempotency_key FROM tasks INDEXED BY tasks_unfinished WHERE state <> 'ended'"
    ).fetchall()
    ms = now_ms()
    recovered = 0
    claimed: list[SpawnEntry] = []
    for task_id, session, parent, agent, agent_path, request, attempts, owner, key in unfinished:
        if owner_alive(owner):
            continue
        ((envelope_id,),) = conn.execute(_LAST_ENVELOPE, (task_id,)).fetchall()
        if envelope_id is None:  # the usual case: it never ended
            cap = reruns.get(agent)
            # Only a root session's spawn runs again: a child's parent session ended
            # with its process, and a parent run again delegates anew.
            if cap is not None and parent is None and attempts < cap:
                conn.execute(_CLAIM, (origin, ms, task_id))
                claimed.append(_claimed(task_id, session, agent, agent_path, request, key))
                continue
            envelope = interrupted_envelope(
                task_id, agent, agent_path, tries=attempts if cap is not None else None
            )
            envelope_id = _deliver(conn, session, task_id, envelope, origin, ms)
        conn.execute(_END, (envelope_id, ms, task_id))
        recovered += 1
    return recovered, claimed


_CLAIM: Final = (
    "UPDATE tasks SET state = 'queued', owner = ?, updated_ms = ? "
    "WHERE task_id = ? AND state <> 'ended'"
)


def _claimed(
    task_id: str, session: str, agent: str, agent_path: str, request: bytes, key: str | None
) -> SpawnEntry:
    data = loads(request)
    return SpawnEntry(
        task_id=task_id,
        session_id=session,
        parent_task=None,
        agent=agent,
        agent_path=agent_path,
        request=cast("Mapping[str, JSONValue]", data if isinstance(data, dict) else {}),
        idempotency_key=key,
    )


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
_NEAR: Final = 8
"""Stored ids read on either side of an unknown one, at most."""
_NEAR_PREFIX: Final = 3
_NEAR_COLUMNS: Final = "SELECT task_id, session, state, owner, envelope_id FROM tasks "
_NEAR_ABOVE: Final = _NEAR_COLUMNS + "WHERE task_id >= ? AND task_id < ? ORDER BY task_id LIMIT ?"
_NEAR_BELOW: Final = (
    _NEAR_COLUMNS + "WHERE task_id < ? AND task_id >= ? ORDER BY task_id DESC LIMIT ?"
)
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
        path: str,
        submit: Callable[[Write], int],
        read: Read,
        wait_committed: Callable[[int], Awaitable[None]],
        decode: Callable[[bytes], DelegateResult],
    ) -> None:
        self._origin = origin
        self._path = path
        self._submit = submit
        self._read = read
        self._wait = wait_committed
        self._decode = decode
        self._last_end = 0
        self._claimed: list[SpawnEntry] = []
        self._forgetting: set[str] = set()

    def spawned(self, entry: SpawnEntry) -> int:
        """Queue the spawn's ``tasks`` and ``names`` rows; returns the write's sequence
        number (what :meth:`wait_journaled` waits for). Never blocks."""
        return self._submit(_SpawnWrite(entry, self._origin))

    def started(self, task_id: str) -> int:
        """Queue: the task is ``running`` (``attempts + 1``); returns the write's sequence
        number. Never blocks."""
        return self._submit(_StartWrite(task_id))

    def ended(
        self,
        task_id: str,
        session_id: str,
        envelope: DelegateResult,
        deliver: bool = False,
        then: Callable[[], object] | None = None,
    ) -> None:
        """Queue: the task is ``ended``, linked to the envelope row its mailbox wrote (or,
        if none did, to one written here: with ``deliver``, unread in the session's
        mailbox); ``then()`` runs on the event loop once that is committed, or once the
        store has failed first. Never blocks."""
        self._last_end = self._submit(
            _EndWrite(task_id, session_id, envelope, deliver, self._origin, then)
        )

    def forgotten(self, task_id: str) -> None:
        """Queue: the ended task ``task_id`` was forgotten (its rows are deleted, its name
        kept, so :meth:`lookup` no longer finds it, in any process). Never blocks."""
        self._submit(_ForgetWrite(task_id, self._forgetting, self._submit, again=True))
        self._forgetting.add(task_id)

    def location(self) -> str:
        """The store's file."""
        return self._path

    def near(self, task_id: str) -> dict[str, str]:
        """Up to :data:`_NEAR` ended tasks of other origins on either side of ``task_id``
        in key order, among those sharing its first :data:`_NEAR_PREFIX` characters, by
        id with their sessions. Two range reads of the primary key, each of at most
        :data:`_NEAR` rows (filtered here, so the limit bounds the rows read)."""
        prefix = task_id[:_NEAR_PREFIX]
        above = prefix + "\U0010ffff"  # above every id that starts with prefix

        def query(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
            found = conn.execute(_NEAR_ABOVE, (task_id, above, _NEAR)).fetchall()
            return found + conn.execute(_NEAR_BELOW, (task_id, prefix, _NEAR)).fetchall()

        rows = cast("list[tuple[object, ...]]", self._read(query))
        return {
            str(found): str(session)
            for found, session, state, owner, envelope_id in rows
            if state == "ended"
            and envelope_id is not None
            and owner != self._origin
            and found not in self._forgetting
        }

    def holds(self, task_id: str) -> str | None:
        """The state of the ``tasks`` row of ``task_id``, or ``None`` without one (or
        forgotten: being deleted, or, by an earlier version, unlinked from its envelope).
        One primary-key read."""
        if task_id in self._forgetting:
            return None

        def query(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
            return conn.execute(_STATE, (task_id,)).fetchall()

        found = cast("list[tuple[object, ...]]", self._read(query))
        if not found:
            return None
        ((state, envelope_id),) = found
        return None if state == "ended" and envelope_id is None else str(state)

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

    async def flush(self) -> None:
        """Block until every end queued so far is committed, or the store has failed."""
        # A failed store has run their then() with the failure: nothing waits on them.
        with contextlib.suppress(StoreError):
            await self._wait(self._last_end)

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

    async def recover(self, reruns: Mapping[str, int] | None = None) -> int:
        """Give each unfinished task of an ended process its one envelope, or claim it for
        running again (:meth:`claimed`), in one transaction of the writer thread; returns
        how many were finished. ``reruns`` maps the agents whose spawns run again to
        their cap of tries. Blocks until committed; cancellation stops the wait, not the
        write."""
        write = _RecoverWrite(self._origin, reruns or {})
        await self._wait(self._submit(write))
        self._claimed.extend(write.rerun)
        return write.recovered

    def claimed(self) -> list[SpawnEntry]:
        """The spawns the last :meth:`recover` claimed for running again (now owned by
        this store, ``queued``), handed out once."""
        claimed, self._claimed = self._claimed, []
        return claimed
