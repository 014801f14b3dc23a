"""The bridge under contention: another connection holding the store's write lock past
the room's busy timeout delays the bridge; it does not stop it."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import anyio
import pytest

from subagents import SubagentManager
from subagents.room import Room, bridge
from tests.room.bridge_support import bridged, room_ids, state_of

pytestmark = pytest.mark.anyio


class _Stopped(logging.Handler):
    """Sets ``event`` when the bridge logs that it stopped."""

    def __init__(self, event: anyio.Event) -> None:
        super().__init__(logging.INFO)
        self.event = event
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "stop" in record.getMessage():
            self.seen.append(
                record.getMessage() + " " + str(record.exc_info and record.exc_info[1])
            )
            self.event.set()


async def test_a_write_lock_held_past_the_busy_timeout_does_not_stop_the_bridge(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    stopped = anyio.Event()
    handler = _Stopped(stopped)
    logger = logging.getLogger("subagents.room")
    logger.addHandler(handler)
    try:
        async with (
            bridged(path) as b,
            Room(path, busy_timeout=0.05) as room,
            SubagentManager() as manager,
            bridge(room, manager) as link,
        ):
            b.manager.send(link.member_id, "one")
            (first,) = await room_ids(b, 1)
            await state_of(b, first, link.member_id, "accepted")  # handed on, not read
            holder = sqlite3.connect(path, isolation_level=None)
            try:
                holder.execute("BEGIN IMMEDIATE")  # the write lock, past the busy timeout
                assert [m.body for m in manager.inbox()] == ["one"]  # its mark_read waits
                with anyio.move_on_after(1):
                    await stopped.wait()
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            assert not stopped.is_set(), handler.seen
            receipt = manager.send(b.link.member_id, "still bridged?")
            assert receipt.state == "queued", receipt
            with anyio.fail_after(30):
                got = await b.manager.recv(timeout=None)
            assert got is not None
            assert got.body == "still bridged?"
            await state_of(b, first, link.member_id, "read")
    finally:
        logger.removeHandler(handler)
