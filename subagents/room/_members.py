"""The SQL of members and rooms: join, leave, the room's autonomy cap, who, prune.

Each function runs inside the caller's transaction (``BEGIN IMMEDIATE`` for the writes)
and reads the room's clock value ``now`` the caller read inside it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import Final

from .._errors import ConfigError
from .._json import dumps_str, loads
from .._processes import pid_running
from ._ids import new_member_id
from ._records import AUTONOMY, LIVE, Autonomy, Joined

__all__ = [
    "MAX_NAME",
    "absolute",
    "absolute_for",
    "check_autonomy",
    "check_name",
    "cwd_of",
    "directory",
    "join",
    "leave",
    "member_rooms",
    "set_cap",
    "signal_waiting",
    "touch",
    "unwakeable",
]

MAX_NAME: Final = 200
"""The longest room name, label or tag (characters)."""


def absolute(path: str, cwd: str) -> str:
    """``path`` made absolute against ``cwd``, its directory resolved as ``open`` resolves
    it (symlinks followed as far as they exist, then ``..`` and ``.``; a leading ``//`` is
    ``/``) and its final name kept: ``src/x.py`` from ``/repo``, ``/repo/src/x.py`` and
    the same file through a symlinked directory are one path, and a symlinked file is
    its own path under the name the member used, whatever the link points at when (a
    deploy retargets ``current.py``; its release, drift check and ``file:`` selector
    still name ``current.py``). A final ``.``, ``..`` or ``/`` names a directory: the
    whole path is resolved."""
    full = os.path.join(cwd, os.path.expanduser(path))
    head, name = os.path.split(full)
    if name in ("", ".", ".."):
        return os.path.realpath(full)
    return os.path.join(os.path.realpath(head or os.sep), name)


def directory(cwd: str | None) -> str:
    """A working directory (``None``: this process's) made absolute, every symlink of it
    resolved (its final name too: the directory is what relative paths are read in)."""
    where = os.getcwd() if cwd is None else os.path.expanduser(cwd)
    return os.path.realpath(os.path.join(os.getcwd(), where))


def check_name(field: str, value: object) -> str:
    """A room name, label or tag: a non-empty string of at most :data:`MAX_NAME`."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME:
        raise ConfigError(field, f"a non-empty string of at most {MAX_NAME} characters", value)
    return value


def check_autonomy(field: str, value: object) -> Autonomy:
    if value == "wake" or value == "notify" or value == "hold":
        return value
    raise ConfigError(field, "'wake', 'notify' or 'hold'", value)


def _rank(level: Autonomy) -> int:
    return AUTONOMY.index(level)


def _cap(conn: sqlite3.Connection, rooms: Sequence[str]) -> Autonomy:
    """The lowest cap of ``rooms`` (``wake`` where none is set)."""
    level: Autonomy = "wake"
    for room in rooms:
        row = conn.execute("SELECT autonomy FROM room_caps WHERE room = ?", (room,)).fetchone()
        if row is not None and _rank(row[0]) < _rank(level):
            level = row[0]
    return level


def member_rooms(conn: sqlite3.Connection, member: str) -> tuple[str, ...]:
    rows = conn.execute(
        "SELECT room FROM room_memberships WHERE member_id = ? ORDER BY room", (member,)
    ).fetchall()
    return tuple(str(r[0]) for r in rows)


def join(
    conn: sqlite3.Connection,
    *,
    rooms: Sequence[str],
    label: str | None,
    tags: Sequence[str] | None,
    autonomy: Autonomy | None,
    harness_key: str | None,
    cwd: str,
    pid: int | None,
    pid_start: int | None,
    now: float,
) -> Joined:
    """Join ``rooms`` (a new member, or the one that joined with ``harness_key`` before)."""
    existing = None
    if harness_key is not None:
        existing = conn.execute(
            "SELECT member_id, autonomy FROM room_members WHERE harness_key = ?", (harness_key,)
        ).fetchone()
    known_rooms = member_rooms(conn, existing[0]) if existing is not None else ()
    cap = _cap(conn, [*rooms, *known_rooms])
    warning = None
    if existing is None:
        wanted: Autonomy = autonomy or "wake"
        level = wanted if _rank(wanted) <= _rank(cap) else cap
        if level != wanted:
            warning = f"autonomy {wanted!r} is above the room's cap: {level!r} applies"
        member = new_member_id()
        conn.execute(
            "INSERT INTO room_members (member_id, harness_key, label, tags, cwd, pid, "
            "pid_start, autonomy, joined_at, seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                member,
                harness_key,
                label or "",
                dumps_str(list(tags or ())),
                cwd,
                pid,
                pid_start,
                level,
                now,
                now,
            ),
        )
    else:
        member, stored = str(existing[0]), existing[1]
        wanted = stored
        if autonomy is not None and _rank(autonomy) < _rank(stored):
            warning = (
                f"autonomy {autonomy!r} refused: {stored!r} stays (a re-join never lowers "
                "the level; lowering is the operator's, through set_autonomy_cap)"
            )
        elif autonomy is not None:
            wanted = autonomy
        # The cap of every room the member is in now holds, a kept level included.
        level = wanted if _rank(wanted) <= _rank(cap) else cap
        if level != wanted:
            warning = f"autonomy {wanted!r} is above the room's cap: {level!r} applies"
        conn.execute(
            "UPDATE room_members SET cwd = ?, pid = ?, pid_start = ?, autonomy = ?, "
            "seen_at = ?, label = coalesce(?, label), tags = coalesce(?, tags) "
            "WHERE member_id = ?",
            (
                cwd,
                pid,
                pid_start,
                level,
                now,
                label,
                None if tags is None else dumps_str(list(tags)),
                member,
            ),
        )
        if tags is not None:
            conn.execute("DELETE FROM room_tags WHERE member_id = ?", (member,))
        if level != "wake":
            unwakeable(conn, member)  # held to a cap: as a lowering, no repeats
        elif pid is None or pid_running(pid, pid_start):
            signal_waiting(conn, member, now)
    if tags is not None:
        conn.executemany(
            "INSERT OR IGNORE INTO room_tags (tag, member_id) VALUES (?, ?)",
            [(tag, member) for tag in tags],
        )
    conn.executemany(
        "INSERT OR IGNORE INTO room_memberships (room, member_id, joined_at) VALUES (?, ?, ?)",
        [(room, member, now) for room in rooms],
    )
    return Joined(
        member_id=member, rooms=member_rooms(conn, member), autonomy=level, warning=warning
    )


def leave(conn: sqlite3.Connection, member: str, room: str | None) -> tuple[str, ...]:
    """Leave ``room`` (``None``: every room); the rooms the member is still in."""
    if room is None:
        conn.execute("DELETE FROM room_memberships WHERE member_id = ?", (member,))
    else:
        conn.execute(
            "DELETE FROM room_memberships WHERE room = ? AND member_id = ?", (room, member)
        )
    return member_rooms(conn, member)


def set_cap(conn: sqlite3.Connection, room: str, autonomy: Autonomy) -> int:
    """Set ``room``'s cap and lower its members above it; how many were lowered."""
    conn.execute(
        "INSERT INTO room_caps (room, autonomy) VALUES (?, ?) "
        "ON CONFLICT (room) DO UPDATE SET autonomy = excluded.autonomy",
        (room, autonomy),
    )
    above = [level for level in AUTONOMY if _rank(level) > _rank(autonomy)]
    if not above:
        return 0
    marks = ", ".join("?" * len(above))
    lowered = conn.execute(
        f"UPDATE room_members SET autonomy = ? WHERE autonomy IN ({marks}) AND member_id IN "
        "(SELECT member_id FROM room_memberships WHERE room = ?) RETURNING member_id",
        (autonomy, *above, room),
    ).fetchall()
    for (member,) in lowered:
        unwakeable(conn, str(member))
    return len(lowered)


def unwakeable(conn: sqlite3.Connection, member: str) -> None:
    """The member can no longer be woken (lowered below ``wake``, or pruned): its
    ``offered`` deliveries become ``undeliverable``, so no signal is repeated to it."""
    conn.execute(
        "UPDATE room_deliveries SET state = 'undeliverable' "
        "WHERE recipient = ? AND state = 'offered' AND state IN " + LIVE,
        (member,),
    )


def signal_waiting(conn: sqlite3.Connection, member: str, now: float) -> None:
    """The member is at ``wake`` with a process to wake (it came back, or was raised): its
    deliveries never signalled (``stored``) or not signallable then (``undeliverable``)
    are signalled now, by this commit."""
    conn.execute(
        "UPDATE room_deliveries SET state = 'offered', offered_at = ?, signals = signals + 1, "
        "changed_at = ? WHERE recipient = ? AND state IN ('stored', 'undeliverable') "
        "AND state IN " + LIVE,
        (now, now, member),
    )


def cwd_of(conn: sqlite3.Connection, member: str) -> str:
    """The member's working directory (as :func:`directory` made it at join)."""
    return str(
        conn.execute("SELECT cwd FROM room_members WHERE member_id = ?", (member,)).fetchone()[0]
    )


def absolute_for(conn: sqlite3.Connection, member: str, path: str) -> str:
    """``path`` made absolute against the member's working directory."""
    return absolute(path, cwd_of(conn, member))


def touch(conn: sqlite3.Connection, member: str, now: float) -> None:
    """The member's activity: its ``seen_at``, and for a member at ``notify`` the signals of
    its deliveries not yet taken by a turn ride on this one (they become ``accepted``)."""
    row = conn.execute(
        "UPDATE room_members SET seen_at = ? WHERE member_id = ? RETURNING autonomy",
        (now, member),
    ).fetchone()
    if row is not None and row[0] == "notify":
        conn.execute(
            "UPDATE room_deliveries SET state = 'accepted', changed_at = ? "
            "WHERE recipient = ? AND state IN ('stored', 'offered', 'undeliverable') "
            "AND state IN " + LIVE,
            (now, member),
        )


def member_row(conn: sqlite3.Connection, member: str) -> dict[str, object]:
    """One member's row, tags decoded."""
    cursor = conn.execute("SELECT * FROM room_members WHERE member_id = ?", (member,))
    names = [d[0] for d in cursor.description]
    row = cursor.fetchone()
    found = dict(zip(names, row, strict=True))
    found["tags"] = tuple(loads(found["tags"]))  # type: ignore[arg-type]
    return found
