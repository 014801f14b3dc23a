"""Every statement the room runs on a request path reads by an index: none scans a table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from subagents.room import Room
from tests.room.support import FakeClock

pytestmark = pytest.mark.anyio


async def test_no_statement_of_a_room_call_scans_a_table(tmp_path: Path) -> None:
    statements: list[str] = []
    (tmp_path / "x.py").write_text("x")
    clock = FakeClock()
    async with Room(tmp_path / "s.db", retry_window=0, clock=clock) as room:
        room._db().conn.raw.set_trace_callback(statements.append)
        a = (await room.join("r", tags=["t"], cwd=str(tmp_path), label="a")).member_id
        b = (await room.join("r", autonomy="notify", cwd=str(tmp_path))).member_id
        await room.claim(b, "x.py", ttl=1)
        clock.advance(2)  # the next claim removes the expired lease
        assert (await room.claim(a, "x.py", mode="shared")).ok
        for selector in ("*", "tag:t", "file:x.py", b):
            await room.send(a, selector, "m", ttl=60)
        await room.peek(b)
        await room.peek(b, after=1, limit=2)
        await room.accept(b, [1, 2])
        await room.mark_read(b, [1])
        await room.receive(b)
        await room.receive(b)
        await room.ack(b, 1)
        await room.accept(a)
        await room.unread(a)
        await room.sent(a)
        await room.history("r")
        await room.who("r")
        await room.who()
        await room.check("x.py", member=a)
        await room.leases(a)
        await room.renew(a, "x.py")
        await room.note_read(a, "x.py")
        await room.drift_check(a, "x.py")
        await room.release(a, "x.py")
        await room.set_autonomy_cap("r", "hold")
        await room.prune(silent_for=0, room="r")
        await room.leave(b)
        with pytest.raises(LookupError):
            await room.unread(a[:5])
    queries = [
        s for s in dict.fromkeys(statements) if s.split()[0] in ("SELECT", "UPDATE", "DELETE")
    ]
    assert len(queries) > 20
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        scans = []
        for statement in queries:
            plan = conn.execute(f"EXPLAIN QUERY PLAN {statement}").fetchall()
            scans += [(statement, row[3]) for row in plan if str(row[3]).startswith("SCAN room_")]
    finally:
        conn.close()
    # who() of the whole store lists members in primary-key order: a walk bounded by LIMIT.
    listing = "SELECT member_id FROM room_members ORDER BY member_id LIMIT 1000"
    assert (listing, "SCAN room_members") in scans
    scans.remove((listing, "SCAN room_members"))
    assert not scans, "\n".join(f"{step}: {sql}" for sql, step in scans)
