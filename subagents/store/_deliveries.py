"""The SQL of a mailbox's delivery rows: put, look, count, take.

A delivery is one (envelope, recipient) row; a session's mailbox is its recipient ``''``.
Its ``state`` only moves forward, from ``stored`` to one final state (a trigger refuses
anything else): ``read`` (taken by a consumer), ``expired`` (its TTL passed unread) or
``replaced`` (a put of the same task id overwrote it unread). An entry is *live* while
``stored`` and not past ``expires_at``; at most one live row exists per task id (a partial
unique index). Rows are marked ``expired`` lazily, by the writes that meet them; reads
filter on ``expires_at`` themselves.

The planner, without statistics, would count and take through the arrival index (every
row the session ever had); ``INDEXED BY`` keeps those on the live rows' own index.

``now`` is the mailbox clock (float seconds, that of ``expires_at``); ``ms`` is unix
milliseconds, for the ``*_ms`` columns.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from .._envelope import DelegateResult
from .._json import dumps_str, loads
from ._bulk import has_nul, segments
from ._errors import StoreError

__all__ = [
    "Entry",
    "bodies",
    "claim",
    "claim_ids",
    "count_live",
    "decode",
    "find",
    "find_row",
    "give_back",
    "has_stored",
    "insert",
    "last_id",
    "live_among",
    "mark_read",
    "puts_since",
    "with_bodies",
]

_LIVE: Final = "state = 'stored' AND (expires_at IS NULL OR expires_at > :now)"
_KEY: Final = "session = :session AND recipient = :recipient"
_EXPIRED_OR: Final = "CASE WHEN expires_at IS NOT NULL AND expires_at <= :now THEN 'expired' ELSE"

# A list of puts at once, as one JSON array (``json_each``): SQLite steps each statement
# once, not once a row (see the journal's spawn inserts for why that matters). Rows
# ``_bulk`` keeps out of a list go one by one, with the same columns.
_INSERT_ENVELOPES: Final = (
    "INSERT INTO envelopes (id, session, task_id, body, created_ms) "
    "SELECT json_extract(value, '$[0]'), json_extract(value, '$[2]'), "
    "json_extract(value, '$[4]'), CAST(json_extract(value, '$[10]') AS BLOB), :ms "
    "FROM json_each(:rows) ORDER BY key"
)
_INSERT_DELIVERIES: Final = (
    "INSERT INTO deliveries (id, envelope_id, session, recipient, task_id, state, "
    "stored_at, expires_at, origin, consumer, changed_ms) "
    "SELECT json_extract(value, '$[1]'), json_extract(value, '$[0]'), "
    "json_extract(value, '$[2]'), json_extract(value, '$[3]'), json_extract(value, '$[4]'), "
    "json_extract(value, '$[5]'), json_extract(value, '$[6]'), json_extract(value, '$[7]'), "
    "json_extract(value, '$[8]'), json_extract(value, '$[9]'), :ms "
    "FROM json_each(:rows) ORDER BY key"
)
_INSERT_ENVELOPE: Final = (
    "INSERT INTO envelopes (id, session, task_id, body, created_ms) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_DELIVERY: Final = (
    "INSERT INTO deliveries (id, envelope_id, session, recipient, task_id, state, "
    "stored_at, expires_at, origin, consumer, changed_ms) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# Delivery ids are AUTOINCREMENT (never reused, unlike envelope ids, whose newest is
# free again once its task is forgotten): the next is above this.
_LAST_DELIVERY: Final = (
    "SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'deliveries'"
)


class Entry(Protocol):
    """One put, as :func:`insert` writes it."""

    session: str
    recipient: str
    task_id: str
    body: bytes
    stored_at: float
    """The mailbox clock when it was put."""
    expires_at: float | None
    origin: str
    claimed: bool
    """Consumed (by ``origin``) before it was written: it arrives ``read``."""
    envelope_id: int
    """Set by :func:`insert`: the id of the envelope row written for it."""
    delivery_id: int
    """Set by :func:`insert`: the id of its delivery row, never given to another."""


def insert(conn: sqlite3.Connection, entries: Sequence[Entry], ms: int) -> None:
    """Put envelopes, in order: each arrives ``stored`` (or already ``read``), and the
    schema's ``deliveries_overwrite`` trigger retires the unread row of the same key. Two
    statements for the whole list, mostly (``_bulk``); call inside ``BEGIN IMMEDIATE``,
    which makes the ids taken here (after the largest) free to use."""
    ((largest,),) = conn.execute("SELECT coalesce(max(id), 0) FROM envelopes").fetchall()
    ((last,),) = conn.execute(_LAST_DELIVERY).fetchall()
    rows = []
    for n, e in enumerate(entries, 1):
        e.envelope_id = int(largest) + n
        e.delivery_id = int(last) + n
        rows.append(
            (
                e.envelope_id,
                e.delivery_id,
                e.session,
                e.recipient,
                e.task_id,
                "read" if e.claimed else "stored",
                e.stored_at,
                e.expires_at,
                e.origin,
                e.origin if e.claimed else None,
                e.body,
            )
        )
    for as_json, part in segments(conn, rows, size=_size, nul=_nul):
        if as_json:
            listed = [(*row[:10], row[10].decode()) for row in part]
            params = {"rows": dumps_str(listed), "ms": ms}
            conn.execute(_INSERT_ENVELOPES, params)
            conn.execute(_INSERT_DELIVERIES, params)
        else:
            conn.executemany(_INSERT_ENVELOPE, [(r[0], r[2], r[4], r[10], ms) for r in part])
            conn.executemany(_INSERT_DELIVERY, [(r[1], r[0], *r[2:10], ms) for r in part])


_Row = tuple[int, int, str, str, str, str, float, "float | None", str, "str | None", bytes]


def _size(row: _Row) -> int:
    return len(row[10])


def _nul(row: _Row) -> bool:
    return has_nul((row[2], row[3], row[4], row[8]))


def decode(path: str, body: bytes) -> DelegateResult:
    """The envelope a row's body holds.

    Raises:
        StoreError: ``corrupt``: the body is not an envelope's JSON.
    """
    try:
        data = loads(body)
        if not isinstance(data, dict):
            raise ValueError(f"an envelope is a JSON object, not {type(data).__name__}")
        return DelegateResult.from_dict(data)
    except ValueError as exc:
        raise StoreError(path, "corrupt", f"an unreadable envelope: {exc}") from exc


def find(
    conn: sqlite3.Connection, session: str, recipient: str, task_id: str, now: float
) -> bytes | None:
    """The body of ``task_id``'s live entry, or ``None``."""
    rows = conn.execute(
        "SELECT e.body FROM deliveries d JOIN envelopes e ON e.id = d.envelope_id "
        "WHERE d.session = :session AND d.recipient = :recipient AND d.task_id = :task_id "
        "AND d.state = 'stored' AND (d.expires_at IS NULL OR d.expires_at > :now)",
        {"session": session, "recipient": recipient, "task_id": task_id, "now": now},
    ).fetchall()
    return bytes(rows[0][0]) if rows else None


def find_row(
    conn: sqlite3.Connection, session: str, recipient: str, task_id: str, now: float
) -> int:
    """The delivery id of ``task_id``'s live entry, or 0."""
    rows = conn.execute(
        f"SELECT id FROM deliveries WHERE {_KEY} AND task_id = :task_id AND {_LIVE}",
        {"session": session, "recipient": recipient, "task_id": task_id, "now": now},
    ).fetchall()
    return int(rows[0][0]) if rows else 0


def mark_read(conn: sqlite3.Connection, marks: list[tuple[int, str, float]], ms: int) -> None:
    """Each ``(delivery_id, consumer, now)``: that row read by ``consumer`` if it is still
    unread (``expired`` past its TTL at ``now``). Call inside ``BEGIN IMMEDIATE``."""
    conn.executemany(
        f"UPDATE deliveries SET state = {_EXPIRED_OR} 'read' END, "
        "consumer = CASE WHEN expires_at IS NOT NULL AND expires_at <= :now THEN NULL "
        "ELSE :consumer END, changed_ms = :ms WHERE id = :id AND state = 'stored'",
        [{"id": d, "consumer": consumer, "now": now, "ms": ms} for d, consumer, now in marks],
    )


def count_live(
    conn: sqlite3.Connection,
    session: str,
    recipient: str,
    now: float,
    *,
    limit: int = -1,
    excluding: list[str] | None = None,
) -> int:
    """Live entries, at most ``limit`` of them (-1: no limit), not counting the task ids
    in ``excluding``."""
    extra = " AND task_id NOT IN (SELECT value FROM json_each(:excluding))" if excluding else ""
    rows = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM deliveries INDEXED BY deliveries_live "
        f"WHERE {_KEY} AND {_LIVE}{extra} "
        "LIMIT :limit)",
        {
            "session": session,
            "recipient": recipient,
            "now": now,
            "limit": limit,
            "excluding": dumps_str(excluding) if excluding else None,
        },
    ).fetchall()
    return int(rows[0][0])


def has_stored(conn: sqlite3.Connection, session: str, recipient: str) -> bool:
    """Whether any row is ``stored`` (live, or past its TTL and not yet marked)."""
    rows = conn.execute(
        "SELECT 1 FROM deliveries INDEXED BY deliveries_live "
        f"WHERE {_KEY} AND state = 'stored' LIMIT 1",
        {"session": session, "recipient": recipient},
    ).fetchall()
    return bool(rows)


def live_among(
    conn: sqlite3.Connection, session: str, recipient: str, task_ids: list[str], now: float
) -> list[str]:
    """Which of ``task_ids`` have a live entry."""
    rows = conn.execute(
        f"SELECT task_id FROM deliveries WHERE {_KEY} AND {_LIVE} "
        "AND task_id IN (SELECT value FROM json_each(:ids))",
        {"session": session, "recipient": recipient, "now": now, "ids": dumps_str(task_ids)},
    ).fetchall()
    return [str(task_id) for (task_id,) in rows]


def last_id(conn: sqlite3.Connection) -> int:
    """The newest delivery id of the whole store (ids are never reused), 0 if none."""
    rows = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'deliveries'").fetchall()
    return int(rows[0][0]) if rows else 0


def puts_since(
    conn: sqlite3.Connection, session: str, recipient: str, after: int, origin: str
) -> tuple[int, int]:
    """``(newest id, puts by others)`` among the mailbox's rows after id ``after`` (a range
    of the primary key: only the rows added since)."""
    rows = conn.execute(
        "SELECT max(id), count(*) FILTER (WHERE origin <> :origin) FROM deliveries "
        f"WHERE id > :after AND {_KEY}",
        {"session": session, "recipient": recipient, "after": after, "origin": origin},
    ).fetchall()
    newest, foreign = rows[0]
    return int(newest or after), int(foreign)


def claim(
    conn: sqlite3.Connection,
    session: str,
    recipient: str,
    task_id: str,
    *,
    consumer: str,
    now: float,
    ms: int,
    known: Callable[[str, int], bool] | None = None,
) -> tuple[int, bytes | None] | None:
    """Take ``task_id``'s live entry (it becomes ``read``): ``(delivery_id, body)``, the
    body ``None`` where ``known(task_id, delivery_id)`` (the caller has the envelope in
    hand); an entry past its TTL becomes ``expired`` instead (``None``). Call inside
    ``BEGIN IMMEDIATE``: the one ``UPDATE … RETURNING`` is what makes a take exactly-once
    across processes."""
    params = {
        "session": session,
        "recipient": recipient,
        "task_id": task_id,
        "consumer": consumer,
        "now": now,
        "ms": ms,
    }
    rows = conn.execute(
        f"UPDATE deliveries SET state = {_EXPIRED_OR} 'read' END, "
        "consumer = CASE WHEN expires_at IS NOT NULL AND expires_at <= :now THEN NULL "
        "ELSE :consumer END, changed_ms = :ms "
        f"WHERE {_KEY} AND task_id = :task_id AND state = 'stored' "
        "RETURNING id, state, envelope_id",
        params,
    ).fetchall()
    if not rows or rows[0][1] != "read":
        return None
    delivery_id, _, envelope_id = rows[0]
    if known is not None and known(task_id, int(delivery_id)):
        return int(delivery_id), None
    body = conn.execute("SELECT body FROM envelopes WHERE id = ?", (envelope_id,)).fetchall()
    return int(delivery_id), bytes(body[0][0])


def with_bodies(
    conn: sqlite3.Connection,
    taken: list[tuple[str, int, int]],
    known: Callable[[str, int], bool],
) -> list[tuple[str, int, bytes | None]]:
    """:func:`claim_ids`' rows as ``(task_id, delivery_id, body)``, the body ``None``
    where ``known(task_id, delivery_id)`` (the caller has that envelope in hand)."""
    held = {delivery_id for task_id, delivery_id, _ in taken if known(task_id, delivery_id)}
    wanted = [envelope_id for _, delivery_id, envelope_id in taken if delivery_id not in held]
    found = bodies(conn, wanted)
    return [
        (task_id, delivery_id, None if delivery_id in held else found[envelope_id])
        for task_id, delivery_id, envelope_id in taken
    ]


def claim_ids(
    conn: sqlite3.Connection,
    session: str,
    recipient: str,
    *,
    consumer: str,
    now: float,
    ms: int,
    excluding: list[str] | None = None,
    skipping: list[int] | None = None,
) -> list[tuple[str, int, int]]:
    """Take every live entry but those of the task ids in ``excluding`` and the delivery
    rows in ``skipping``, in arrival order, as ``(task_id, delivery_id, envelope_id)``;
    entries past their TTL become ``expired``. Call inside ``BEGIN IMMEDIATE``."""
    params = {
        "session": session,
        "recipient": recipient,
        "consumer": consumer,
        "now": now,
        "excluding": dumps_str(excluding or []),
        "skipping": dumps_str(skipping or []),
    }
    conn.execute(
        "UPDATE deliveries INDEXED BY deliveries_live SET state = 'expired', changed_ms = :ms "
        f"WHERE {_KEY} "
        "AND state = 'stored' AND expires_at IS NOT NULL AND expires_at <= :now",
        {**params, "ms": ms},
    )
    taken = conn.execute(
        "UPDATE deliveries INDEXED BY deliveries_live SET state = 'read', consumer = :consumer, "
        f"changed_ms = :ms WHERE {_KEY} AND state = 'stored' "
        "AND task_id NOT IN (SELECT value FROM json_each(:excluding)) "
        "AND id NOT IN (SELECT value FROM json_each(:skipping)) "
        "RETURNING id, task_id, envelope_id",
        {**params, "ms": ms},
    ).fetchall()
    taken.sort()
    return [
        (str(task_id), int(delivery_id), int(envelope_id))
        for delivery_id, task_id, envelope_id in taken
    ]


def bodies(conn: sqlite3.Connection, envelope_ids: list[int]) -> dict[int, bytes]:
    """The bodies of those of the envelope rows ``envelope_ids`` there are, by id (one
    statement)."""
    if not envelope_ids:
        return {}
    found = conn.execute(
        "SELECT id, body FROM envelopes WHERE id IN (SELECT value FROM json_each(?))",
        (dumps_str(envelope_ids),),
    ).fetchall()
    return {int(envelope_id): bytes(body) for envelope_id, body in found}


def give_back(
    conn: sqlite3.Connection, delivery_ids: list[int], origin: str, ms: int
) -> list[tuple[str, int]]:
    """Make the taken rows ``delivery_ids`` unread again, each as a new row of its envelope
    put by ``origin`` (the taker: its row is new to every other mailbox object, the one
    that put it first included), unless a newer row of its id has come since (it was
    overwritten meanwhile) or its task is forgotten; ``(task_id, new delivery id)`` of
    each given back. Newer rows
    are looked for among the envelopes of the task id (indexed), not among all rows.
    Call inside ``BEGIN IMMEDIATE``."""
    given = conn.execute(
        "INSERT INTO deliveries (envelope_id, session, recipient, task_id, state, stored_at, "
        "expires_at, origin, consumer, changed_ms) "
        "SELECT envelope_id, session, recipient, task_id, 'stored', stored_at, expires_at, "
        ":origin, NULL, :ms FROM deliveries AS taken "
        "WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'read' AND NOT EXISTS ("
        "SELECT 1 FROM envelopes AS e JOIN deliveries AS newer ON newer.envelope_id = e.id "
        "WHERE e.task_id = taken.task_id AND e.session = taken.session "
        "AND newer.recipient = taken.recipient AND newer.task_id = taken.task_id "
        "AND newer.id > taken.id) ORDER BY id RETURNING task_id, id",
        {"ids": dumps_str(delivery_ids), "origin": origin, "ms": ms},
    ).fetchall()
    return [(str(task_id), int(delivery_id)) for task_id, delivery_id in given]
