"""The journal's writes, each a :class:`~._writer.Write` in the writer thread's one queue:
a spawn's row, its start, its end, a forget; and an envelope put unread into a session's
mailbox by the journal itself (a recovered task's, or one ended as its manager closed).

They are group-committed with the mailboxes' puts: a child's envelope put (by its
session's mailbox) comes before its end write, which links the row the mailbox wrote
instead of writing the envelope again.

Between two writes that keep their places (:meth:`~._writer.Write.order`), a batch's
spawns, starts, puts and ends are applied in that order, class by class, which is the
order one task's writes are submitted in. A write of a later class commutes with one of
an earlier class submitted after it, because the two are another task's: a spawn inserts
a new id, a start needs its task queued (so never follows its end), a put touches only
the mailbox's rows. A keyed spawn keeps its place: it frees its key from an ended task,
whose end must come first. An end links its task's newest envelope row when the end is
applied, so a put of the same task id submitted after its end (a user's own put into the
mailbox, in the same batch) is the one it links: either is that task's envelope.

A task's start and end that meet its spawn in one run are written by it (``merge_ends``):
the spawn then goes after the ends (order 4), and commutes with what a lower order holds
for the same reasons, its own start and end being the ones it writes.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Final, Self

import attrs

from .._envelope import DelegateResult, now_ms
from .._journal import SpawnEntry
from .._json import dumps, dumps_str
from . import _deliveries as rows
from ._bulk import has_nul, segments
from ._writer import Write

__all__ = [
    "END_TASK",
    "LAST_ENVELOPE",
    "TASK_STATE",
    "EndWrite",
    "ForgetWrite",
    "SpawnWrite",
    "StartWrite",
    "deliver_unread",
]

logger = logging.getLogger("subagents.store")

# A plain INSERT: an id the store holds already fails the batch loudly, never silently
# (spawn checks the store first, so only a race with another process could clash). An
# idempotency key another row holds is not a failure: two processes that both found the
# key free spawned at once, and the later row is written without it (design/store.md).
_INSERT_TASK: Final = (
    "INSERT INTO tasks (task_id, session, parent_task, agent, agent_path, request, "
    "idempotency_key, state, attempts, owner, created_ms, updated_ms) "
    "VALUES (:task_id, :session, :parent, :agent, :path, :request, CASE WHEN :key IS NULL "
    "THEN NULL WHEN EXISTS (SELECT 1 FROM tasks WHERE session = :session AND "
    "idempotency_key = :key) THEN NULL ELSE :key END, "
    "CASE WHEN :attempts > 0 THEN 'running' ELSE 'queued' END, :attempts, :owner, :ms, :ms)"
)
# A key is free again once its task is forgotten (its envelope unlinked), or, for a task
# this store journaled, once its record is dropped here (a spawn with the key found none).
_RELEASE_KEY: Final = (
    "UPDATE tasks SET idempotency_key = NULL WHERE session = ? AND idempotency_key = ? "
    "AND state = 'ended' AND (envelope_id IS NULL OR owner = ?)"
)
_INSERT_NAME: Final = "INSERT OR IGNORE INTO names (session, agent_path, task_id) VALUES (?, ?, ?)"
# Unkeyed spawns, a whole run at once: each statement takes its rows as one JSON array
# (``json_each``), so SQLite steps it once instead of once a row. (Every step releases
# the GIL and must take it back; while the event loop runs Python that can wait up to a
# switch interval, so a row-by-row executemany crawls exactly when the loop is busiest.)
# Texts and blobs travel as JSON strings; ``CAST ... AS BLOB`` gives back their bytes.
# With ``:ended`` (spawns whose end came in the same batch, ``_merging.merge_ends``, applied
# after its puts) each row is ended at once, linked to its task's newest envelope row, when
# a put wrote one; ``$[6]`` is 1 when the task's start was counted in the row.
_INSERT_TASKS: Final = (
    "INSERT INTO tasks (task_id, session, parent_task, agent, agent_path, request, "
    "state, attempts, owner, envelope_id, created_ms, updated_ms) "
    "SELECT task_id, session, parent_task, agent, agent_path, request, "
    "CASE WHEN envelope_id IS NOT NULL THEN 'ended' WHEN attempts > 0 THEN 'running' "
    "ELSE 'queued' END, attempts, :owner, envelope_id, :ms, :ms FROM ("
    "SELECT key, json_extract(value, '$[0]') AS task_id, json_extract(value, '$[1]') AS session, "
    "json_extract(value, '$[2]') AS parent_task, json_extract(value, '$[3]') AS agent, "
    "json_extract(value, '$[4]') AS agent_path, "
    "CAST(json_extract(value, '$[5]') AS BLOB) AS request, "
    "json_extract(value, '$[6]') AS attempts, CASE WHEN :ended THEN (SELECT max(e.id) "
    "FROM envelopes e WHERE e.task_id = json_extract(value, '$[0]')) END AS envelope_id "
    "FROM json_each(:rows)) ORDER BY key"
)
_UNENDED: Final = (
    "SELECT j.value FROM json_each(:ids) j JOIN tasks t ON t.task_id = j.value "
    "WHERE t.state <> 'ended'"
)
_INSERT_NAMES: Final = (
    "INSERT OR IGNORE INTO names (session, agent_path, task_id) "
    "SELECT json_extract(value, '$[1]'), json_extract(value, '$[4]'), "
    "json_extract(value, '$[0]') FROM json_each(:rows) ORDER BY key"
)
_START_TASK: Final = (
    "UPDATE tasks SET state = 'running', attempts = attempts + 1, updated_ms = ? "
    "WHERE task_id = ? AND state = 'queued'"
)
_START_TASKS: Final = (
    "UPDATE tasks SET state = 'running', attempts = attempts + 1, updated_ms = :ms "
    "WHERE task_id IN (SELECT value FROM json_each(:ids)) AND state = 'queued'"
)
LAST_ENVELOPE: Final = "SELECT max(id) FROM envelopes WHERE task_id = ?"
END_TASK: Final = (
    "UPDATE tasks SET state = 'ended', envelope_id = ?, updated_ms = ? "
    "WHERE task_id = ? AND state <> 'ended'"
)
# The usual end, for a whole batch at once: its mailbox wrote the envelope row. An end
# whose start came in the same batch (``merge_ends``, its id in ``:started``) counts the
# try too, as _START_TASK would (only a queued task's).
_END_LINKED: Final = (
    "UPDATE tasks SET state = 'ended', updated_ms = :ms, "
    "attempts = attempts + (state = 'queued' AND task_id IN "
    "(SELECT value FROM json_each(:started))), "
    "envelope_id = (SELECT max(e.id) FROM envelopes e WHERE e.task_id = tasks.task_id) "
    "WHERE task_id IN (SELECT value FROM json_each(:ids)) AND state <> 'ended' "
    "AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = tasks.task_id)"
)
_DELETE_TASK: Final = "DELETE FROM tasks WHERE task_id = ? AND state = 'ended'"
# Its deliveries go by the cascade; the foreign key from tasks.envelope_id is checked by
# the index tasks_envelope (without it every delete would scan the tasks).
_DELETE_ENVELOPES: Final = (
    "DELETE FROM envelopes WHERE task_id = :task_id "
    "AND NOT EXISTS (SELECT 1 FROM tasks WHERE task_id = :task_id)"
)
TASK_STATE: Final = "SELECT state, envelope_id FROM tasks WHERE task_id = ?"


class SpawnWrite(Write):
    """A spawn's ``tasks`` and ``names`` rows. While the writer has not taken it, a start
    of its task is counted in it (:meth:`count_start`) instead of updating the row after;
    in the writer, an end of its task in the same run of the batch is written by it too
    (``_merging.merge_ends``): its row is then inserted ended, after the puts."""

    __slots__ = ("end", "entry", "index", "open", "owner", "started")

    ORDER = 0
    ENDED_ORDER: Final = 4  # with its end: after the puts, whose rows it links

    def __init__(
        self, entry: SpawnEntry, owner: str, index: dict[str, SpawnWrite] | None = None
    ) -> None:
        super().__init__()
        self.entry = entry
        self.owner = owner
        self.open = True  # neither taken nor handed back (changes under the writer's lock)
        self.started = False  # its task's start is written in its row
        self.end: EndWrite | None = None
        # The journal's spawns still open, by task id: this one leaves it once taken or
        # handed back, from the writer's thread (a dict operation is atomic; a start that
        # still finds it decides under the lock, by ``open``).
        self.index = index

    def _close(self) -> None:
        self.open = False
        if self.index is not None:
            self.index.pop(self.entry.task_id, None)

    def order(self) -> int | None:
        if self.entry.idempotency_key is not None:
            return None
        return self.ORDER if self.end is None else self.ENDED_ORDER

    def take(self) -> bool:
        self._close()
        return True

    def release(self) -> None:
        self._close()

    def count_start(self) -> bool:
        """Under the writer's lock: the task's start, written in this row itself if the
        writer has not taken it yet (else False: the start is a write of its own). A later
        start changes nothing, as one of a running task alone does not."""
        if not self.open:
            return False
        self.started = True
        return True

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ms = now_ms()
        keyed = [w for w in writes if w.entry.idempotency_key is not None]
        if keyed:
            conn.executemany(
                _RELEASE_KEY,
                [(w.entry.session_id, w.entry.idempotency_key, w.owner) for w in keyed],
            )
            # Row by row: a key is taken only if no row of the session holds it, rows
            # written earlier in this run included.
            _insert_rows(conn, [(w, dumps(w.entry.request)) for w in writes], ms)
            return
        ended = writes[0].end is not None  # a run is all of one order
        rows = [(w, dumps(w.entry.request)) for w in writes]
        for as_json, part in segments(conn, rows, size=_request_size, nul=_spawn_nul):
            if as_json:
                _insert_list(conn, part, ms, ended)
            else:
                _insert_rows(conn, part, ms)
        if ended:
            ids = [w.entry.task_id for w in writes]
            unended = (
                set(ids)  # their rows went in unended, row by row: each linked below
                if has_nul(ids)
                else {row[0] for row in conn.execute(_UNENDED, {"ids": dumps_str(ids)})}
            )
            if unended:
                _end_each(conn, [w.end for w in writes if w.end and w.end.task_id in unended])


_SpawnRow = tuple[SpawnWrite, bytes]  # a spawn write and its request as JSON


def _request_size(row: _SpawnRow) -> int:
    return len(row[1])


def _spawn_nul(row: _SpawnRow) -> bool:
    e = row[0].entry
    return has_nul((e.task_id, e.session_id, e.parent_task, e.agent, e.agent_path))


def _insert_list(conn: sqlite3.Connection, rows: Sequence[_SpawnRow], ms: int, ended: bool) -> None:
    """Unkeyed spawns, their rows as one JSON list (one owner: every write of a store
    carries its origin); ``ended``: each linked to its task's envelope, if one is written."""
    listed = [
        (e.task_id, e.session_id, e.parent_task, e.agent, e.agent_path, body.decode(), started)
        for w, body in rows
        for e, started in ((w.entry, int(w.started)),)
    ]
    text = dumps_str(listed)
    conn.execute(_INSERT_TASKS, {"owner": rows[0][0].owner, "ms": ms, "rows": text, "ended": ended})
    conn.execute(_INSERT_NAMES, {"rows": text})


def _insert_rows(conn: sqlite3.Connection, rows: Sequence[_SpawnRow], ms: int) -> None:
    conn.executemany(
        _INSERT_TASK,
        [
            {
                "task_id": e.task_id,
                "session": e.session_id,
                "parent": e.parent_task,
                "agent": e.agent,
                "path": e.agent_path,
                "request": request,
                "key": e.idempotency_key,
                "attempts": int(w.started),
                "owner": w.owner,
                "ms": ms,
            }
            for w, request in rows
            for e in (w.entry,)
        ],
    )
    conn.executemany(
        _INSERT_NAME, [(w.entry.session_id, w.entry.agent_path, w.entry.task_id) for w, _ in rows]
    )


class StartWrite(Write):
    """The starts of tasks whose spawn rows the writer had taken, gathered while it has
    not taken this write: one write, and one statement, for the starts of a batch instead
    of one each. :meth:`add` and :meth:`withdraw` run under the writer's lock, where
    ``open`` (cleared when the writer takes or hands back the write) decides."""

    __slots__ = ("open", "task_ids")

    ORDER = 1

    def __init__(self, task_id: str) -> None:
        super().__init__()
        self.task_ids = {task_id: None}
        self.open = True

    def add(self, task_id: str) -> bool:
        """Under the writer's lock: ``task_id``'s start, written by this write if the
        writer has not taken it yet (else False)."""
        if not self.open:
            return False
        self.task_ids[task_id] = None
        return True

    def withdraw(self, task_id: str) -> bool:
        """Under the writer's lock: ``task_id``'s start taken out of this write, for its
        end to count the try, if the writer has not taken the write yet (else False)."""
        if not self.open or task_id not in self.task_ids:
            return False
        del self.task_ids[task_id]
        return True

    def take(self) -> bool:
        self.open = False
        return bool(self.task_ids)  # every start withdrawn: nothing left to write

    def release(self) -> None:
        self.open = False

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ms = now_ms()
        ids = [task_id for w in writes for task_id in w.task_ids]
        if not ids:  # merge_ends counted them all elsewhere
            return
        if has_nul(ids):  # never a task id this library draws; json_each would cut it
            conn.executemany(_START_TASK, [(ms, task_id) for task_id in ids])
        else:
            conn.execute(_START_TASKS, {"ms": ms, "ids": dumps_str(ids)})


def _insert_envelope(conn: sqlite3.Connection, session: str, task_id: str, body: bytes) -> int:
    """An envelope row with no delivery (no mailbox wrote it); returns its id."""
    ((largest,),) = conn.execute("SELECT coalesce(max(id), 0) FROM envelopes").fetchall()
    envelope_id = int(largest) + 1
    conn.execute(
        "INSERT INTO envelopes (id, session, task_id, body, created_ms) VALUES (?, ?, ?, ?, ?)",
        (envelope_id, session, task_id, body, now_ms()),
    )
    return envelope_id


class EndWrite(Write):
    __slots__ = ("deliver", "envelope", "merged", "origin", "session", "started", "task_id", "then")

    ORDER = 3  # after the puts (Put.ORDER), whose rows it links

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
        self.merged = False  # written by its task's spawn, in the same batch (merge_ends)
        self.started = False  # it writes its task's start, of the same batch (merge_ends)

    def done(self) -> None:
        if self.then is not None:
            self.then()

    def failed(self) -> None:
        if self.then is not None:
            self.then()

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ms = now_ms()
        ends = [w for w in writes if not w.merged]
        if not ends:
            return
        ids = [w.task_id for w in ends]
        if has_nul(ids):  # never a task id this library draws; json_each would cut it
            _end_each(conn, ends)
            return
        started = [w.task_id for w in ends if w.started]
        linked = conn.execute(
            _END_LINKED, {"ids": dumps_str(ids), "started": dumps_str(started), "ms": ms}
        ).rowcount
        if linked != len(ends):
            # Some task's mailbox wrote no envelope (or the task is ended or not stored):
            # each one alone, in submission order (an envelope delivered here gets its
            # arrival order), the ones just linked now ended (END_TASK leaves them so).
            _end_each(conn, ends)


def _end_each(conn: sqlite3.Connection, writes: Sequence[EndWrite]) -> None:
    """Each end alone (its merged start first): linked to its task's newest envelope row,
    or to one written here (unread in its session's mailbox with ``deliver``)."""
    ms = now_ms()
    for w in writes:
        if w.started:
            conn.execute(_START_TASK, (ms, w.task_id))
        ((envelope_id,),) = conn.execute(LAST_ENVELOPE, (w.task_id,)).fetchall()
        if envelope_id is None and w.deliver:  # ended as its manager closed
            envelope_id = deliver_unread(conn, w.session, w.task_id, w.envelope, w.origin, ms)
        elif envelope_id is None:  # its mailbox did not write it (full, closed)
            envelope_id = _insert_envelope(conn, w.session, w.task_id, w.envelope.to_json())
        conn.execute(END_TASK, (envelope_id, ms, w.task_id))


class ForgetWrite(Write):
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
                self.submit(ForgetWrite(self.task_id, self.pending, self.submit, again=False))
                return
            except Exception:  # the store is closing or failed: the row stays
                logger.warning("forgetting task %s in the store failed", self.task_id)
        self.pending.discard(self.task_id)

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ids = [(w.task_id,) for w in writes]
        deleted = conn.executemany(_DELETE_TASK, ids).rowcount
        conn.executemany(_DELETE_ENVELOPES, [{"task_id": w.task_id} for w in writes])
        if deleted < len(writes):  # a task not ended yet (or never stored)
            for w in writes:
                w.unended = bool(conn.execute(TASK_STATE, (w.task_id,)).fetchall())


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
    envelope_id: int = 0
    delivery_id: int = 0


def deliver_unread(
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
    ((envelope_id,),) = conn.execute(LAST_ENVELOPE, (task_id,)).fetchall()
    return int(envelope_id)
