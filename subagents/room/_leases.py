"""The SQL of file leases and read baselines: claim, renew, release, check, drift.

A claim is the one operation that must be atomic across processes: the caller runs it
inside ``BEGIN IMMEDIATE``, where it removes the path's expired leases, reads the holders
left and inserts, with no other writer in between. A lease that ends (released, expired,
its member gone) leaves a span behind for a while, so a drift check can still tell that
a file changed while another member held it.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from typing import Final

from .._errors import SubagentsError
from ._members import absolute_for
from ._records import Claim, Drift, Lease, LeaseCheck, LeaseMode

__all__ = [
    "LeaseNotHeld",
    "SPAN_KEEP",
    "check",
    "check_as",
    "claim",
    "drift",
    "member_leases",
    "note_read",
    "sha256_of",
    "release",
    "release_all",
    "renew",
]

SPAN_KEEP: Final = 7 * 24 * 3600.0
"""Seconds an ended lease is remembered for drift checks."""


class LeaseNotHeld(SubagentsError, LookupError):
    """A renew of a lease the member does not hold (never claimed, released or expired).

    Attributes:
        member_id, path: the member and the absolute path.
    """

    def __init__(self, member_id: str, path: str, detail: str) -> None:
        self.member_id = member_id
        self.path = path
        super().__init__(f"member {member_id} holds no live lease on {path!r}: {detail}")


def _lease(path: str, row: Sequence[object]) -> Lease:
    member, mode, claimed, expires = row
    return Lease(
        path=path,
        member_id=str(member),
        mode="exclusive" if mode == "exclusive" else "shared",
        claimed_at=float(claimed),  # type: ignore[arg-type]
        expires_at=float(expires),  # type: ignore[arg-type]
    )


def _remove(
    conn: sqlite3.Connection, where: str, params: tuple[object, ...], now: float
) -> list[Sequence[object]]:
    """Delete the leases ``where`` selects and remember them as spans; the rows
    ``(path, member, mode, claimed_at, expires_at)`` removed. ``where`` is this module's
    own SQL, never a caller's text."""
    rows: list[Sequence[object]] = conn.execute(
        f"DELETE FROM room_leases WHERE {where} "
        "RETURNING path, member_id, mode, claimed_at, expires_at",
        params,
    ).fetchall()
    conn.executemany(
        "INSERT INTO room_lease_spans (path, member_id, mode, claimed_at, ended_at) "
        "VALUES (?, ?, ?, ?, ?)",
        [(p, m, mode, c, min(now, float(e))) for p, m, mode, c, e in rows],  # type: ignore[arg-type]
    )
    return rows


def _live(conn: sqlite3.Connection, path: str, now: float) -> list[Lease]:
    """The path's live leases, after moving its expired ones to spans."""
    if _remove(conn, "path = ? AND expires_at <= ?", (path, now), now):
        conn.execute(
            "DELETE FROM room_lease_spans WHERE path = ? AND ended_at < ?",
            (path, now - SPAN_KEEP),
        )
    return check(conn, path, now)


def claim(
    conn: sqlite3.Connection, member: str, path: str, mode: LeaseMode, ttl: float, now: float
) -> Claim:
    """Claim ``path`` (absolute); inside ``BEGIN IMMEDIATE``. A member's own lease never
    blocks it: claiming again renews it, or changes its mode when the others allow."""
    holders = _live(conn, path, now)
    others = [lease for lease in holders if lease.member_id != member]
    blocking = [lease for lease in others if mode == "exclusive" or lease.mode == "exclusive"]
    if blocking:
        first = next((b for b in blocking if b.mode == "exclusive"), blocking[0])
        if first.mode == "exclusive":
            reason = f"held exclusively by {first.member_id}"
        else:
            reason = f"shared by {len(others)} other member(s): an exclusive claim waits"
        return Claim(ok=False, path=path, holder=first, reason=reason, at=now)
    row = conn.execute(
        "INSERT INTO room_leases (path, member_id, mode, claimed_at, expires_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (path, member_id) DO UPDATE SET "
        "mode = excluded.mode, expires_at = excluded.expires_at "
        "RETURNING member_id, mode, claimed_at, expires_at",
        (path, member, mode, now, now + ttl),
    ).fetchone()
    return Claim(ok=True, path=path, lease=_lease(path, row), reason="claimed", at=now)


def renew(conn: sqlite3.Connection, member: str, path: str, ttl: float, now: float) -> Lease:
    row = conn.execute(
        "UPDATE room_leases SET expires_at = ? WHERE path = ? AND member_id = ? "
        "AND expires_at > ? RETURNING member_id, mode, claimed_at, expires_at",
        (now + ttl, path, member, now),
    ).fetchone()
    if row is None:
        raise LeaseNotHeld(member, path, "it expired or was never claimed: claim it again")
    return _lease(path, row)


def release(conn: sqlite3.Connection, member: str, path: str, now: float) -> bool:
    """Release the member's lease on ``path``; whether a live one was held."""
    rows = _remove(conn, "path = ? AND member_id = ?", (path, member), now)
    return any(float(row[4]) > now for row in rows)  # type: ignore[arg-type]


def release_all(conn: sqlite3.Connection, member: str, now: float) -> int:
    return len(_remove(conn, "member_id = ?", (member,), now))


def check(conn: sqlite3.Connection, path: str, now: float) -> list[Lease]:
    """The live leases of ``path`` (a read: expired rows are skipped, not removed)."""
    rows = conn.execute(
        "SELECT member_id, mode, claimed_at, expires_at FROM room_leases "
        "WHERE path = ? AND expires_at > ? ORDER BY claimed_at",
        (path, now),
    ).fetchall()
    return [_lease(path, row) for row in rows]


def check_as(conn: sqlite3.Connection, member: str, path: str, now: float) -> LeaseCheck:
    """:func:`check` of ``path`` made absolute against the member's directory."""
    full = absolute_for(conn, member, path)
    return LeaseCheck(path=full, leases=tuple(check(conn, full, now)))


def member_leases(conn: sqlite3.Connection, member: str, now: float) -> list[Lease]:
    rows = conn.execute(
        "SELECT path, member_id, mode, claimed_at, expires_at FROM room_leases "
        "WHERE member_id = ? AND expires_at > ? ORDER BY path",
        (member, now),
    ).fetchall()
    return [_lease(str(row[0]), row[1:]) for row in rows]


def note_read(conn: sqlite3.Connection, member: str, path: str, sha: str, now: float) -> None:
    conn.execute(
        "INSERT INTO room_reads (member_id, path, sha256, read_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (member_id, path) DO UPDATE SET sha256 = excluded.sha256, "
        "read_at = excluded.read_at",
        (member, path, sha, now),
    )


def drift(conn: sqlite3.Connection, member: str, path: str, sha: str | None, now: float) -> Drift:
    """Compare the file's hash now (``None``: it is gone) with the member's baseline."""
    row = conn.execute(
        "SELECT sha256, read_at FROM room_reads WHERE member_id = ? AND path = ?",
        (member, path),
    ).fetchone()
    if row is None:
        return Drift(
            path=path,
            severity="SAFE",
            changed=False,
            message="no baseline: call note_read when you read the file",
        )
    baseline, read_at = str(row[0]), float(row[1])
    if sha == baseline:
        return Drift(path=path, severity="SAFE", changed=False, message="unchanged since read")
    what = "deleted" if sha is None else "changed"
    # A lease row counts if it lasted past the baseline: live now, or expired since and
    # not removed yet (spans hold only the leases a release, claim or prune removed).
    held = conn.execute(
        "SELECT member_id, claimed_at FROM room_leases WHERE path = ? AND member_id <> ? "
        "AND expires_at > ? ORDER BY claimed_at LIMIT 1",
        (path, member, read_at),
    ).fetchone()
    if held is None:
        held = conn.execute(
            "SELECT member_id, claimed_at FROM room_lease_spans WHERE path = ? "
            "AND ended_at > ? AND member_id <> ? ORDER BY ended_at DESC LIMIT 1",
            (path, read_at, member),
        ).fetchone()
    if held is None:
        return Drift(
            path=path,
            severity="MINOR",
            changed=True,
            message=f"{what} since read; no other member held a lease on it",
        )
    return Drift(
        path=path,
        severity="CRITICAL",
        changed=True,
        holder=str(held[0]),
        since=float(held[1]),
        message=f"{what} since read while member {held[0]} held a lease on it: read it again",
    )


def sha256_of(path: str) -> str | None:
    """The file's SHA-256 (hex), ``None`` when there is no file. Blocking."""
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except FileNotFoundError:
        return None
