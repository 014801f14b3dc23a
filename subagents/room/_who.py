"""Who is in a room, and prune: member rows with their liveness.

Liveness needs one scan of the running processes' environments for every harness key of
the answer, so it is computed for a page of members at once, never per member.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from . import _leases, _members
from ._liveness import liveness, running_keys
from ._members import check_autonomy
from ._records import Member

__all__ = ["prune", "rows", "silent_rows", "with_liveness"]


def rows(raw: sqlite3.Connection, room: str | None, limit: int) -> list[dict[str, object]]:
    """Up to ``limit`` member rows (of ``room``, or the store), by member id."""
    if room is None:
        ids = raw.execute("SELECT member_id FROM room_members ORDER BY member_id LIMIT ?", (limit,))
    else:
        ids = raw.execute(
            "SELECT member_id FROM room_memberships WHERE room = ? ORDER BY member_id LIMIT ?",
            (room, limit),
        )
    return _rows(raw, [str(r[0]) for r in ids.fetchall()])


def silent_rows(
    raw: sqlite3.Connection, room: str | None, before: float, limit: int
) -> list[dict[str, object]]:
    """Up to ``limit`` member rows (of ``room``, or the store) last seen before ``before``,
    the longest silent first (the ``seen_at`` index)."""
    ids = raw.execute(
        "SELECT member_id FROM room_members WHERE seen_at < ? ORDER BY seen_at LIMIT ?",
        (before, limit if room is None else limit * 10),
    ).fetchall()
    members = [str(r[0]) for r in ids]
    if room is not None:
        inside = "SELECT 1 FROM room_memberships WHERE room = ? AND member_id = ?"
        members = [m for m in members if raw.execute(inside, (room, m)).fetchone()][:limit]
    return _rows(raw, members)


def _rows(raw: sqlite3.Connection, members: Sequence[str]) -> list[dict[str, object]]:
    found = []
    for member in members:
        row = _members.member_row(raw, member)
        row["rooms"] = _members.member_rooms(raw, member)
        found.append(row)
    return found


def _optional_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def with_liveness(found: Sequence[dict[str, object]]) -> tuple[Member, ...]:
    keys = running_keys({str(r["harness_key"]) for r in found if r["harness_key"]})
    members = []
    for row in found:
        pid = _optional_int(row["pid"])
        key = None if row["harness_key"] is None else str(row["harness_key"])
        tags: Sequence[str] = row["tags"]  # type: ignore[assignment]
        rooms: Sequence[str] = row["rooms"]  # type: ignore[assignment]
        members.append(
            Member(
                member_id=str(row["member_id"]),
                label=str(row["label"]),
                tags=tuple(tags),
                rooms=tuple(rooms),
                cwd=str(row["cwd"]),
                pid=pid,
                harness_key=key,
                autonomy=check_autonomy("autonomy", row["autonomy"]),
                joined_at=float(str(row["joined_at"])),
                seen_at=float(str(row["seen_at"])),
                liveness=liveness(pid, _optional_int(row["pid_start"]), key, keys),
            )
        )
    return tuple(members)


def prune(
    raw: sqlite3.Connection, candidates: Sequence[str], threshold: float, now: float
) -> tuple[str, ...]:
    """Delete those of ``candidates`` (found gone) still silent past ``threshold``."""
    removed = []
    for member in candidates:
        # Seen since the look (a re-join from a new process): not silent any more.
        row = raw.execute("SELECT seen_at FROM room_members WHERE member_id = ?", (member,))
        seen = row.fetchone()
        if seen is None or seen[0] >= now - threshold:
            continue
        _leases.release_all(raw, member, now)
        _members.unwakeable(raw, member)
        raw.execute("DELETE FROM room_members WHERE member_id = ?", (member,))
        removed.append(member)
    return tuple(removed)
