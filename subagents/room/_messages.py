"""The SQL of messages: selectors, send, receive, ack, unread, sent, history, signals.

A send stores the message once, a row per room the sender is in (the history), and one
delivery row per resolved recipient. A delivery's state only moves forward (a trigger of
the schema refuses anything else); ``expired`` is written lazily, by the recipient's next
receive or count, which read its live deliveries by the inbox index anyway.
"""

from __future__ import annotations

import fnmatch
import os
import sqlite3
from collections.abc import Sequence
from typing import Final

from .._errors import ConfigError
from .._processes import pid_running
from ._ids import resolve_member
from ._members import member_rooms
from ._records import LIVE, DeliveryState, Inbox, Message, Sent, SentMessage

__all__ = [
    "EXPIRE_BATCH",
    "FILE_SCAN",
    "MAX_BODY",
    "accept",
    "ack",
    "has_live",
    "history",
    "inbox",
    "mark",
    "peek",
    "receive",
    "resend_signals",
    "send",
    "sent",
    "UNREAD_CAP",
    "unread",
]

MAX_BODY: Final = 256 * 1024
"""The longest message body (characters)."""
MAX_SUBJECT: Final = 200
FILE_SCAN: Final = 10_000
"""A ``file:`` selector matches at most this many live leases of the sender's rooms (the
one request that reads rows it does not look up by key); past it the send says so."""
RESEND_BATCH: Final = 100
"""Wake signals repeated by one call at most."""
EXPIRE_BATCH: Final = 1000
"""Deliveries one receive marks expired at most (the rest on the next)."""
UNREAD_CAP: Final = 1000
""":func:`unread` counts up to this many (the count reads the inbox index, so its cost
is bounded by this, not by a member's backlog)."""

_MESSAGE_COLUMNS: Final = (
    "m.id, m.sender, m.selector, m.subject, m.body, m.reply_to, m.created_at, m.expires_at"
)


def _message(row: Sequence[object]) -> Message:
    return Message(
        message_id=int(row[0]),  # type: ignore[call-overload]
        sender=str(row[1]),
        selector=str(row[2]),
        subject=None if row[3] is None else str(row[3]),
        body=str(row[4]),
        reply_to=None if row[5] is None else int(row[5]),  # type: ignore[call-overload]
        created_at=float(row[6]),  # type: ignore[arg-type]
        expires_at=None if row[7] is None else float(row[7]),  # type: ignore[arg-type]
    )


def _file_matches(glob: str, path: str, cwd: str) -> bool:
    """The lease path in its three forms: full, relative to the holder's directory, bare
    file name."""
    forms = [path, os.path.basename(path)]
    if path.startswith(cwd.rstrip(os.sep) + os.sep):
        forms.append(os.path.relpath(path, cwd))
    return any(fnmatch.fnmatchcase(form, glob) for form in forms)


def _scope(rooms: Sequence[str]) -> tuple[str, list[str]]:
    return ", ".join("?" * len(rooms)), list(rooms)


def _resolve(
    conn: sqlite3.Connection, sender: str, to: str, rooms: Sequence[str], now: float, store: str
) -> tuple[list[str], str | None]:
    """The recipients of selector ``to`` among members of ``rooms``, and a warning."""
    if to.startswith(("file:", "tag:")) or to == "*":
        if not rooms:
            return [], "the sender is in no room: '*', 'tag:' and 'file:' reach nobody"
        marks, params = _scope(rooms)
    if to == "*":
        rows = conn.execute(
            f"SELECT DISTINCT member_id FROM room_memberships WHERE room IN ({marks}) "
            "AND member_id <> ? ORDER BY member_id",
            (*params, sender),
        ).fetchall()
        return [str(r[0]) for r in rows], None
    if to.startswith("tag:"):
        rows = conn.execute(
            "SELECT DISTINCT t.member_id FROM room_tags t JOIN room_memberships m "
            f"ON m.member_id = t.member_id WHERE t.tag = ? AND m.room IN ({marks}) "
            "AND t.member_id <> ? ORDER BY t.member_id",
            (to[4:], *params, sender),
        ).fetchall()
        return [str(r[0]) for r in rows], None
    if to.startswith("file:"):
        glob = to[5:]
        if not glob:
            raise ConfigError("to", "'file:' followed by a glob", to)
        rows = conn.execute(
            "SELECT DISTINCT l.member_id, l.path, p.cwd FROM room_memberships m "
            "JOIN room_leases l ON l.member_id = m.member_id "
            "JOIN room_members p ON p.member_id = l.member_id "
            f"WHERE m.room IN ({marks}) AND l.expires_at > ? AND l.member_id <> ? LIMIT ?",
            (*params, now, sender, FILE_SCAN + 1),
        ).fetchall()
        warning = None
        if len(rows) > FILE_SCAN:
            rows = rows[:FILE_SCAN]
            warning = f"only the first {FILE_SCAN} live leases of the rooms were matched"
        found = sorted({str(m) for m, path, cwd in rows if _file_matches(glob, path, cwd)})
        return found, warning
    return [resolve_member(conn, to, store)], None


def send(
    conn: sqlite3.Connection,
    *,
    sender: str,
    to: str,
    body: str,
    subject: str | None,
    ttl: float | None,
    reply_to: int | None,
    room: str | None,
    now: float,
    store: str,
) -> Sent:
    rooms = member_rooms(conn, sender)
    if room is not None and room not in rooms:
        raise ConfigError("room", f"a room the sender is in ({', '.join(rooms) or 'none'})", room)
    recipients, warning = _resolve(conn, sender, to, [room] if room else rooms, now, store)
    expires = None if ttl is None else now + ttl
    (message_id,) = conn.execute(
        "INSERT INTO room_messages (sender, selector, subject, body, reply_to, created_at, "
        "expires_at, recipients) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (sender, to, subject, body, reply_to, now, expires, len(recipients)),
    ).fetchone()
    conn.executemany(
        "INSERT INTO room_message_rooms (room, message_id) VALUES (?, ?)",
        [(r, message_id) for r in rooms],
    )
    for recipient in recipients:
        autonomy, pid, start = conn.execute(
            "UPDATE room_members SET deliveries_total = deliveries_total + 1, "
            "last_delivery_at = ? WHERE member_id = ? RETURNING autonomy, pid, pid_start",
            (now, recipient),
        ).fetchone()
        state: DeliveryState = "stored"
        if autonomy == "wake":
            # The signal is this commit (a receive waiting on the file wakes on it); with
            # no process left to wake, no signal can land.
            gone = pid is not None and not pid_running(int(pid), start)
            state = "undeliverable" if gone else "offered"
        conn.execute(
            "INSERT INTO room_deliveries (message_id, recipient, state, created_at, "
            "expires_at, offered_at, signals, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                message_id,
                recipient,
                state,
                now,
                expires,
                now if state == "offered" else None,
                int(state == "offered"),
                now,
            ),
        )
    if not recipients and warning is None:
        warning = f"{to!r} resolved to nobody: the message is stored, delivered to 0 members"
    return Sent(message_id=int(message_id), recipients=tuple(recipients), warning=warning)


def _expire(conn: sqlite3.Connection, member: str, now: float) -> None:
    """Mark the member's deliveries past their TTL ``expired``: at most
    :data:`EXPIRE_BATCH`, read by the expiry index (only those due)."""
    conn.execute(
        "UPDATE room_deliveries SET state = 'expired', changed_at = ? WHERE id IN "
        "(SELECT id FROM room_deliveries WHERE recipient = ? AND expires_at <= ? "
        f"AND state IN {LIVE} AND expires_at IS NOT NULL ORDER BY expires_at LIMIT ?)",
        (now, member, now, EXPIRE_BATCH),
    )


def has_live(conn: sqlite3.Connection, member: str) -> bool:
    """Whether the member has a delivery not yet read (or one to mark expired)."""
    row = conn.execute(
        f"SELECT 1 FROM room_deliveries WHERE recipient = ? AND state IN {LIVE} LIMIT 1",
        (member,),
    ).fetchone()
    return row is not None


def receive(conn: sqlite3.Connection, member: str, limit: int, now: float) -> list[Message]:
    """Take up to ``limit`` bodies in arrival order, marking their deliveries read."""
    _expire(conn, member, now)
    rows = conn.execute(
        f"SELECT d.id, {_MESSAGE_COLUMNS} FROM room_deliveries d "
        "JOIN room_messages m ON m.id = d.message_id "
        f"WHERE d.recipient = ? AND d.state IN {LIVE} "
        "AND (d.expires_at IS NULL OR d.expires_at > ?) ORDER BY d.id LIMIT ?",
        (member, now, limit),
    ).fetchall()
    if not rows:
        return []
    conn.executemany(
        "UPDATE room_deliveries SET state = 'read', changed_at = ? WHERE id = ?",
        [(now, row[0]) for row in rows],
    )
    conn.execute(
        "UPDATE room_members SET deliveries_read = deliveries_read + ? WHERE member_id = ?",
        (len(rows), member),
    )
    return [_message(row[1:]) for row in rows]


def peek(
    conn: sqlite3.Connection, member: str, after: int | None, limit: int, now: float
) -> list[Message]:
    """Up to ``limit`` bodies not taken (nor past their TTL), in arrival order, after the
    member's delivery of message ``after``; marks nothing. Reads only, by the inbox index.

    Raises:
        ConfigError: ``after`` is not a message delivered to the member.
    """
    start = 0
    if after is not None:
        row = conn.execute(
            "SELECT id FROM room_deliveries WHERE message_id = ? AND recipient = ?",
            (after, member),
        ).fetchone()
        if row is None:
            raise ConfigError("after", f"the id of a message delivered to {member}", after)
        start = int(row[0])
    rows = conn.execute(
        f"SELECT {_MESSAGE_COLUMNS} FROM room_deliveries d "
        "JOIN room_messages m ON m.id = d.message_id "
        f"WHERE d.recipient = ? AND d.state IN {LIVE} AND d.id > ? "
        "AND (d.expires_at IS NULL OR d.expires_at > ?) ORDER BY d.id LIMIT ?",
        (member, start, now, limit),
    ).fetchall()
    return [_message(row) for row in rows]


_BEFORE: Final[dict[str, str]] = {
    "accepted": "('stored', 'offered', 'undeliverable')",
    "read": LIVE,
}


def mark(conn: sqlite3.Connection, member: str, ids: Sequence[int], state: str, now: float) -> int:
    """Move the member's deliveries of messages ``ids`` to ``state`` (``accepted`` or
    ``read``) where that is forward; how many moved. Their TTL counts only for ``read``
    from a state before ``accepted``: an ``accepted`` one (a bridge handed its body on, as
    it looked, before its TTL, however late that commits) is read whenever its reader
    took it. Looked up by (message, recipient); ids that are not the member's are
    skipped (``expired`` ones, marked so already, stay)."""
    if not ids:
        return 0
    marks = ", ".join("?" * len(ids))
    params: tuple[object, ...] = (state, now, *ids, member)
    ttl = ""
    if state == "read":  # accepted whatever the TTL: the bridge took the body as it looked
        ttl = " AND (expires_at IS NULL OR expires_at > ? OR state = 'accepted')"
        params = (*params, now)
    cursor = conn.execute(
        f"UPDATE room_deliveries SET state = ?, changed_at = ? WHERE message_id IN ({marks}) "
        f"AND recipient = ? AND state IN {_BEFORE[state]}{ttl}",
        params,
    )
    moved = cursor.rowcount
    if state == "read" and moved:
        conn.execute(
            "UPDATE room_members SET deliveries_read = deliveries_read + ? WHERE member_id = ?",
            (moved, member),
        )
    return moved


def inbox(conn: sqlite3.Connection, member: str) -> Inbox:
    total, read, last = conn.execute(
        "SELECT deliveries_total, deliveries_read, last_delivery_at FROM room_members "
        "WHERE member_id = ?",
        (member,),
    ).fetchone()
    return Inbox(
        member_id=member,
        rooms=member_rooms(conn, member),
        deliveries=int(total),
        read=int(read),
        last_delivery_at=last,
    )


def ack(conn: sqlite3.Connection, member: str, message_id: int, now: float) -> bool:
    """Mark the member's delivery of ``message_id`` acked; ``False`` if it already was
    final (acked or expired).

    Raises:
        ConfigError: the member never had that message.
    """
    row = conn.execute(
        "SELECT state, expires_at FROM room_deliveries WHERE message_id = ? AND recipient = ?",
        (message_id, member),
    ).fetchone()
    if row is None:
        raise ConfigError("message_id", f"the id of a message delivered to {member}", message_id)
    state, expires = row
    if state in ("acked", "expired"):
        return False
    if state != "read" and expires is not None and expires <= now:
        # Past its TTL before its body was taken: expired (final), as sent() reports it.
        conn.execute(
            "UPDATE room_deliveries SET state = 'expired', changed_at = ? "
            "WHERE message_id = ? AND recipient = ?",
            (now, message_id, member),
        )
        return False
    conn.execute(
        "UPDATE room_deliveries SET state = 'acked', changed_at = ? "
        "WHERE message_id = ? AND recipient = ?",
        (now, message_id, member),
    )
    return True


def unread(conn: sqlite3.Connection, member: str, now: float) -> int:
    """Deliveries waiting for the member (not taken, not past their TTL), counted up to
    :data:`UNREAD_CAP`. Reads only."""
    ((count,),) = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM room_deliveries WHERE recipient = ? "
        f"AND state IN {LIVE} AND (expires_at IS NULL OR expires_at > ?) LIMIT ?)",
        (member, now, UNREAD_CAP),
    ).fetchall()
    return int(count)


def sent(conn: sqlite3.Connection, member: str, limit: int, now: float) -> list[SentMessage]:
    """The member's newest ``limit`` messages, newest first, with each delivery's state
    (one past its TTL and not taken reads ``expired``, as its recipient will find it)."""
    rows = conn.execute(
        f"SELECT {_MESSAGE_COLUMNS} FROM room_messages m WHERE m.sender = ? "
        "ORDER BY m.id DESC LIMIT ?",
        (member, limit),
    ).fetchall()
    found = []
    for row in rows:
        message = _message(row)
        states: dict[str, DeliveryState] = {}
        for recipient, state, expires in conn.execute(
            "SELECT recipient, state, expires_at FROM room_deliveries WHERE message_id = ?",
            (message.message_id,),
        ):
            late = expires is not None and expires <= now
            live = state in ("stored", "offered", "accepted", "undeliverable")
            states[str(recipient)] = "expired" if live and late else state
        found.append(SentMessage(message=message, states=states))
    return found


def history(conn: sqlite3.Connection, room: str, limit: int, before: int | None) -> list[Message]:
    """The room's messages (each sent while its sender was in the room), oldest first:
    the newest ``limit`` of those older than message ``before``. Reads only."""
    rows = conn.execute(
        f"SELECT {_MESSAGE_COLUMNS} FROM room_message_rooms r "
        "JOIN room_messages m ON m.id = r.message_id "
        "WHERE r.room = ? AND r.message_id < ? ORDER BY r.message_id DESC LIMIT ?",
        (room, before if before is not None else 2**62, limit),
    ).fetchall()
    return [_message(row) for row in reversed(rows)]


def accept(conn: sqlite3.Connection, member: str, now: float) -> int:
    """The member's harness took its wake signals: a turn runs (``offered`` becomes
    ``accepted``, never signalled again). How many."""
    cursor = conn.execute(
        "UPDATE room_deliveries SET state = 'accepted', changed_at = ? "
        f"WHERE recipient = ? AND state = 'offered' AND state IN {LIVE}",
        (now, member),
    )
    return cursor.rowcount


def resend_signals(conn: sqlite3.Connection, now: float, window: float) -> int:
    """Repeat the wake signal of deliveries still ``offered`` (no turn took them) whose last
    signal is older than ``window``; at most :data:`RESEND_BATCH` per call."""
    cursor = conn.execute(
        "UPDATE room_deliveries SET offered_at = ?, signals = signals + 1, changed_at = ? "
        "WHERE id IN (SELECT id FROM room_deliveries WHERE state = 'offered' "
        "AND offered_at <= ? ORDER BY offered_at LIMIT ?)",
        (now, now, now - window, RESEND_BATCH),
    )
    return cursor.rowcount
