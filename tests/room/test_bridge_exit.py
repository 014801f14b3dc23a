"""What a bridge leaves in the room at exit: a member without a harness key leaves (no
one can be it again), one with a key stays to be rejoined."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from subagents import SubagentManager
from subagents.room import Room, bridge

pytestmark = pytest.mark.anyio


async def test_a_bridge_without_a_harness_key_leaves_the_room_at_exit(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room, SubagentManager() as manager:
        async with bridge(room, manager) as link:
            assert [m.member_id for m in await room.who("default")] == [link.member_id]
        assert await room.who("default") == ()


async def test_a_bridge_with_a_harness_key_stays_a_member_at_exit(tmp_path: Path) -> None:
    key = str(uuid.uuid4())
    async with Room(tmp_path / "s.db") as room, SubagentManager() as manager:
        async with bridge(room, manager, harness_key=key) as link:
            pass
        assert [m.member_id for m in await room.who("default")] == [link.member_id]
        async with bridge(room, manager, harness_key=key) as again:
            assert again.member_id == link.member_id


async def test_a_send_still_uncommitted_at_exit_fails_closed_and_exit_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    import anyio

    from subagents.room import _bridge, _route

    monkeypatch.setattr(_bridge, "FLUSH_SECONDS", 0.2)
    retried = anyio.Event()
    locked = _route._locked

    def seen(exc: BaseException) -> bool:
        retried.set()  # the commit is in flight, and waits for the lock
        return locked(exc)

    monkeypatch.setattr(_route, "_locked", seen)
    path = tmp_path / "s.db"
    async with (
        Room(path, busy_timeout=0.05) as room,
        Room(path) as other,
        SubagentManager() as manager,
    ):
        target = (await other.join("default", label="target")).member_id
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            with anyio.fail_after(10):  # the lock outlasts the exit: it is bounded anyway
                async with bridge(room, manager):
                    holder.execute("BEGIN IMMEDIATE")
                    receipt = manager.send(target, "never committed")
                    await retried.wait()
                    assert receipt.state == "queued"
            assert receipt.state == "failed", receipt
            assert receipt.reason == "closed"
        finally:
            holder.execute("ROLLBACK")
            holder.close()
