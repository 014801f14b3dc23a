"""The bridge and a message's TTL: once a message was handed to the local inbox, the
room never calls it ``expired`` after its local recipient read it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import SubagentManager
from subagents.room import Room, bridge

pytestmark = pytest.mark.anyio


class Clock:
    """The rooms' wall clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def _state(room: Room, sender: str, message_id: int, recipient: str) -> str:
    for sent in await room.sent(sender, limit=10):
        if sent.message.message_id == message_id:
            return sent.states[recipient]
    raise AssertionError(f"message {message_id} is not in {sender}'s sent()")


async def test_a_message_handed_on_before_its_ttl_and_read_locally_is_read_not_expired(
    tmp_path: Path,
) -> None:
    path, clock = tmp_path / "s.db", Clock()
    async with (
        Room(path, clock=clock) as room,
        Room(path, clock=clock) as other,
        SubagentManager() as manager,
    ):
        sender = (await other.join("default", label="sender")).member_id
        async with bridge(room, manager) as link:
            sent = await other.send(sender, link.member_id, "soon stale", ttl=60)
            with anyio.fail_after(30):
                activity = await manager.activity("root", timeout=None)  # handed on, unread
            assert [m.body for m in activity.messages] == ["soon stale"]
            clock.now += 120  # the TTL passes while it waits in the local inbox
            assert [m.body for m in manager.inbox()] == ["soon stale"]  # its recipient reads it
        # The bridge's exit marked read in the room what was read locally.
        assert await _state(other, sender, sent.message_id, link.member_id) == "read"
