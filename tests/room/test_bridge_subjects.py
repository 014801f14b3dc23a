"""The bridge and a room message's subject: what comes in keeps it, as text the local
recipient (a model reading read_messages too) can see."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from subagents import Event, SubagentConfig, SubagentManager
from subagents._events import MESSAGE
from subagents.room import Room, bridge
from subagents.tools import build_tools

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def subject_sent(
    tmp_path: Path, events: list[Event] | None = None, config: SubagentConfig | None = None
) -> AsyncIterator[tuple[SubagentManager, str]]:
    """A bridged manager (its message events in ``events``) and the member id of another
    process's member that has sent it "the details" with the subject "build broken"."""
    path = tmp_path / "s.db"
    async with (
        Room(path) as room,
        Room(path) as other,
        SubagentManager(config=config) as manager,
        bridge(room, manager) as link,
    ):
        if events is not None:
            manager.events.subscribe(lambda e: events.append(e) if e.type == MESSAGE else None)
        sender = (await other.join("default", label="sender")).member_id
        await other.send(sender, link.member_id, "the details", subject="build broken")
        yield manager, sender


async def test_a_room_messages_subject_reaches_the_local_recipient(tmp_path: Path) -> None:
    async with subject_sent(tmp_path) as (manager, _):
        with anyio.fail_after(30):
            got = await manager.recv(timeout=None)
        assert got is not None
        assert "build broken" in str(got.to_dict()), got


async def test_read_messages_shows_a_room_messages_subject(tmp_path: Path) -> None:
    async with subject_sent(tmp_path) as (manager, sender):
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
    events: list[Event] = []
    async with subject_sent(tmp_path, events, SubagentConfig(capture_content=capture)) as (
        manager,
        _,
    ):
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
