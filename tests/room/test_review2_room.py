"""Second review of the room: the fixes after the first review (the re-join cap, paths
resolved with realpath, the timed receive's deadline). Each test states a behaviour the
issue or design/room.md promises and main does not keep."""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from subagents.room import Room
from tests.room.support import FakeClock

pytestmark = pytest.mark.anyio


def signals_of(path: Path, recipient: str) -> int:
    """How many wake signals the recipient's one delivery had (read from the file)."""
    with closing(sqlite3.connect(path)) as conn:
        (signals,) = conn.execute(
            "SELECT signals FROM room_deliveries WHERE recipient = ?", (recipient,)
        ).fetchone()
    return int(signals)


async def test_a_rejoin_held_to_a_cap_stops_the_signals_offered_before(tmp_path: Path) -> None:
    """A wake member that re-joins into a room capped at ``hold`` is held there (the first
    review's fix); like a member lowered by ``set_autonomy_cap``, it can no longer be
    woken, so a delivery offered before must not be re-signalled every retry window."""
    clock = FakeClock()
    key = str(uuid.uuid4())
    async with Room(tmp_path / "s.db", clock=clock, retry_window=10) as room:
        await room.set_autonomy_cap("quiet", "hold")
        sender = (await room.join("open")).member_id
        woken = (await room.join("open", harness_key=key)).member_id
        await room.send(sender, woken, "x")  # offered: one signal
        assert (await room.join("quiet", harness_key=key)).autonomy == "hold"
        clock.advance(60)
        await room.sent(sender)  # any member's activity repeats due signals
        assert signals_of(tmp_path / "s.db", woken) == 1


async def test_a_lease_claimed_through_a_symlink_is_released_by_the_same_path(
    tmp_path: Path,
) -> None:
    """A member claims ``current.py`` (a symlink) and later releases ``current.py``; the
    link was pointed at another file meanwhile (as a deploy does). Resolving the link at
    each call makes the release miss, and the lease stays held until its TTL."""
    (tmp_path / "v1.py").write_text("1")
    (tmp_path / "v2.py").write_text("2")
    link = tmp_path / "current.py"
    os.symlink(tmp_path / "v1.py", link)
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", cwd=str(tmp_path))).member_id
        assert (await room.claim(member, "current.py")).ok
        link.unlink()
        os.symlink(tmp_path / "v2.py", link)
        assert await room.release(member, "current.py") is True
        assert await room.leases(member) == ()


async def test_a_file_selector_finds_a_holder_by_the_name_it_claimed(tmp_path: Path) -> None:
    """``file:<glob>`` matches a live lease by full path, path relative to the holder's
    directory, or bare file name; a member that claimed ``config.py`` (a symlink into a
    shared directory) is reached by ``file:config.py``."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "config-prod.py").write_text("x")
    os.symlink(tmp_path / "shared" / "config-prod.py", tmp_path / "config.py")
    async with Room(tmp_path / "s.db") as room:
        holder = (await room.join("r", cwd=str(tmp_path))).member_id
        sender = (await room.join("r", cwd=str(tmp_path))).member_id
        assert (await room.claim(holder, "config.py")).ok
        sent = await room.send(sender, "file:config.py", "are you editing it?")
        assert sent.recipients == (holder,)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_timed_receive_returns_by_its_deadline_while_another_process_holds_the_lock(
    tmp_path: Path,
) -> None:
    """``receive(timeout=...)`` "returns by its deadline". Its first take waits for the
    write lock up to ``busy_timeout`` (here 30 s) instead of the time left, so a lock held
    by another connection keeps it past its deadline."""
    path = tmp_path / "s.db"
    async with Room(path, busy_timeout=30) as room:
        member = (await room.join("r")).member_id
        held, done = threading.Event(), threading.Event()

        def hold() -> None:
            with closing(sqlite3.connect(path, isolation_level=None)) as conn:
                conn.execute("BEGIN IMMEDIATE")
                held.set()
                done.wait(1.8)  # released at once when receive returns
                conn.execute("ROLLBACK")

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            await anyio.to_thread.run_sync(held.wait)
            start = anyio.current_time()
            await room.receive(member, timeout=0.1)
            took = anyio.current_time() - start
        finally:
            done.set()
            await anyio.to_thread.run_sync(holder.join)
        # The lock is held 1.8 s; a receive that keeps its 0.1 s deadline is back long before.
        assert took < 1.5, f"receive(timeout=0.1) returned after {took:.2f} s"


async def test_a_drift_check_through_a_retargeted_symlink_sees_the_change(
    tmp_path: Path,
) -> None:
    """A member reads ``current.py`` (``note_read``); the link is pointed at another file,
    so what ``current.py`` opens changed. The check must not answer SAFE "no baseline": the
    member has one, taken through the very path it checks."""
    (tmp_path / "v1.py").write_text("1")
    (tmp_path / "v2.py").write_text("2")
    link = tmp_path / "current.py"
    os.symlink(tmp_path / "v1.py", link)
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", cwd=str(tmp_path))).member_id
        await room.note_read(member, "current.py")
        link.unlink()
        os.symlink(tmp_path / "v2.py", link)
        drift = await room.drift_check(member, "current.py")
        assert drift.changed
        assert drift.severity != "SAFE"


async def test_a_room_entered_twice_at_once_is_refused_once(tmp_path: Path) -> None:
    """Entering an open Room again is refused (the first review's fix), but only once the
    first entry finished opening: two tasks entering at once both open, the second's
    connections replace the first's, which are never closed."""
    room = Room(tmp_path / "s.db")
    outcomes: list[str] = []

    async def enter() -> None:
        try:
            await room.__aenter__()
        except RuntimeError:
            outcomes.append("refused")
        else:
            outcomes.append("entered")

    async with anyio.create_task_group() as tg:
        tg.start_soon(enter)
        tg.start_soon(enter)
    await room.aclose()
    assert sorted(outcomes) == ["entered", "refused"]
