"""The bridge and a room message's subject: what comes in keeps it, as text the local
recipient (a model reading read_messages too) can see."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import SubagentManager
from subagents.room import Room, bridge

pytestmark = pytest.mark.anyio


async def test_a_room_messages_subject_reaches_the_local_recipient(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with (
        Room(path) as room,
        Room(path) as other,
        SubagentManager() as manager,
        bridge(room, manager) as link,
    ):
        sender = (await other.join("default", label="sender")).member_id
        await other.send(sender, link.member_id, "the details", subject="build broken")
        with anyio.fail_after(30):
            got = await manager.recv(timeout=None)
        assert got is not None
        assert "build broken" in str(got.to_dict()), got


async def test_read_messages_shows_a_room_messages_subject(tmp_path: Path) -> None:
    from subagents.tools import build_tools

    path = tmp_path / "s.db"
    async with (
        Room(path) as room,
        Room(path) as other,
        SubagentManager() as manager,
        bridge(room, manager) as link,
    ):
        sender = (await other.join("default", label="sender")).member_id
        await other.send(sender, link.member_id, "the details", subject="build broken")
        tools = build_tools(manager, "root", messaging=True)
        read = await tools.call("read_messages", {"wait_ms": 20_000})
        assert "build broken" in read.content
        (message,) = read.details["messages"]  # type: ignore[misc]
        assert message["subject"] == "build broken"  # type: ignore[index]
        assert manager.send(sender, "no subject here").state == "queued"


@pytest.mark.parametrize("capture", [False, True])
async def test_a_subject_is_content_kept_out_of_events_unless_captured(
    tmp_path: Path, capture: bool
) -> None:
    from subagents import Event, SubagentConfig
    from subagents._events import MESSAGE

    events: list[Event] = []
    path = tmp_path / "s.db"
    async with (
        Room(path) as room,
        Room(path) as other,
        SubagentManager(config=SubagentConfig(capture_content=capture)) as manager,
        bridge(room, manager) as link,
    ):
        manager.events.subscribe(lambda e: events.append(e) if e.type == MESSAGE else None)
        sender = (await other.join("default", label="sender")).member_id
        await other.send(sender, link.member_id, "the details", subject="build broken")
        with anyio.fail_after(30):
            got = await manager.recv(timeout=None)
        assert got is not None
        assert got.subject == "build broken"
    messages = [e.data["message"] for e in events if "message" in e.data]
    assert messages, events
    for message in messages:
        assert isinstance(message, dict)
        assert ("subject" in message) is capture
        assert ("body" in message) is capture
