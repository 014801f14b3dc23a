"""The journal of spawns in the store: the engine's :class:`~subagents._journal.Journal`.

Its writes (``_journal_writes``) and recovery (``_recovery``) go through the writer
thread; its reads through the event loop's connection, one indexed statement each.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, cast

from .._envelope import DelegateResult
from .._journal import KeyedTask, SpawnEntry, StoredTask
from .._json import JSONValue, dumps_str, loads
from ._errors import StoreError
from ._journal_writes import TASK_STATE, EndWrite, ForgetWrite, SpawnWrite, StartWrite
from ._recovery import RecoverWrite, owner_alive
from ._writer import Write

__all__ = ["SqliteJournal"]

logger = logging.getLogger("subagents.store")

_LOOKUP: Final = (
    "SELECT t.session, t.request, e.id, e.body FROM tasks t "
    "JOIN envelopes e ON e.id = t.envelope_id WHERE t.task_id = ? AND t.state = 'ended' "
    "AND t.owner IS NOT ?"
)
_TAKEN: Final = (
    "SELECT j.value FROM json_each(:ids) j WHERE EXISTS "
    "(SELECT 1 FROM tasks WHERE task_id = j.value) OR EXISTS "
    "(SELECT 1 FROM envelopes INDEXED BY envelopes_task WHERE task_id = j.value)"
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
        amend: Callable[[Callable[[], bool]], bool],
        read: Read,
        wait_committed: Callable[[int], Awaitable[None]],
        decode: Callable[[bytes], DelegateResult],
        orphans: list[SpawnEntry],
        delivered: Callable[[str | None], object],
    ) -> None:
        self._origin = origin
        self._path = path
        self._submit = submit
        self._amend = amend
        self._read = read
        self._wait = wait_committed
        self._decode = decode
        self._last_end = 0
        self._orphans = orphans  # the store's: claims an abandoned recovery left
        self._delivered = delivered  # the journal puts into a session's mailbox itself
        self._mine: list[SpawnEntry] = []
        self._forgetting: set[str] = set()
        # Unkeyed spawn writes the writer has not taken yet, until their task starts or
        # ends: a start counted in one of those is a write less (SpawnWrite.count_start).
        self._spawns: dict[str, SpawnWrite] = {}
        self._starts: StartWrite | None = None

    def spawned(self, entry: SpawnEntry) -> int:
        """Queue the spawn's ``tasks`` and ``names`` rows; returns the write's sequence
        number (what :meth:`wait_journaled` waits for). Never waits for the writer."""
        if entry.idempotency_key is not None:
            # It keeps its place in a batch: a start gathered into a write queued before
            # it would update its row before the row is there.
            self._starts = None
            return self._submit(SpawnWrite(entry, self._origin))
        write = self._spawns[entry.task_id] = SpawnWrite(entry, self._origin, self._spawns)
        try:
            return self._submit(write)
        except BaseException:
            self._spawns.pop(entry.task_id, None)
            raise

    def started(self, task_id: str) -> int:
        """Queue: the task is ``running`` (``attempts + 1``), in its spawn's row if the
        writer has not taken that yet, else in the last start write if the writer has not
        taken that (a batch's starts are one write); returns the sequence number of the
        write that carries it. Never waits for the writer."""
        spawn = self._spawns.pop(task_id, None)
        if spawn is not None and self._amend(spawn.count_start):
            return spawn.seq
        starts = self._starts
        if starts is not None and self._amend(functools.partial(starts.add, task_id)):
            return starts.seq
        starts = StartWrite(task_id)
        seq = self._submit(starts)
        self._starts = starts
        return seq

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
        store has failed first. Never waits for the writer."""
        self._spawns.pop(task_id, None)
        end = EndWrite(task_id, session_id, envelope, deliver, self._origin, then)
        starts = self._starts
        if (
            starts is not None
            and task_id in starts.task_ids
            and self._amend(functools.partial(starts.withdraw, task_id))
        ):
            end.started = True
        if deliver:  # it may put the envelope into the mailbox itself, which no put counts
            end.then = functools.partial(self._delivered_then, session_id, then)
        self._last_end = self._submit(end)

    def _delivered_then(self, session_id: str, then: Callable[[], object] | None) -> None:
        self._delivered(session_id)
        if then is not None:
            then()

    def forgotten(self, task_id: str) -> None:
        """Queue: the ended task ``task_id`` was forgotten (its rows are deleted, its name
        kept, so :meth:`lookup` no longer finds it, in any process). Never waits for the
        writer."""
        self._submit(ForgetWrite(task_id, self._forgetting, self._submit, again=True))
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
            return conn.execute(TASK_STATE, (task_id,)).fetchall()

        found = cast("list[tuple[object, ...]]", self._read(query))
        if not found:
            return None
        ((state, envelope_id),) = found
        return None if state == "ended" and envelope_id is None else str(state)

    def taken_among(self, task_ids: list[str]) -> set[str]:
        """Those of ``task_ids`` the store holds a task or an envelope of (one read on the
        event loop's connection: two indexed lookups an id)."""

        def query(conn: sqlite3.Connection) -> set[str]:
            found = conn.execute(_TAKEN, {"ids": dumps_str(task_ids)}).fetchall()
            return {str(task_id) for (task_id,) in found}

        return cast("set[str]", self._read(query))

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
            try:
                data = loads(request)
            except ValueError:  # a damaged request: the envelope is what matters
                data = {}
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
        reruns = reruns or {}
        write = RecoverWrite(self._origin, reruns)
        try:
            await self._wait(self._submit(write))
        except BaseException:
            write.abandon(self._orphans)  # cancelled: the claims wait for another manager
            raise
        self._delivered(None)  # its envelopes went unread into their sessions
        orphans = self._orphans
        taken = [entry for entry in orphans if entry.agent in reruns]
        orphans[:] = [entry for entry in orphans if entry.agent not in reruns]
        self._mine = [*write.rerun, *taken]
        return write.recovered

    def claimed(self) -> list[SpawnEntry]:
        """The spawns this journal's last :meth:`recover` claimed for running again (now
        owned by this store, ``queued``), with those an abandoned recovery left for an
        agent it runs; handed out once."""
        mine, self._mine = self._mine, []
        return mine
