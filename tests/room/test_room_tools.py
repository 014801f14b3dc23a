"""The room's tools for a model: bound to one member, errors as data, the unread rider."""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents.room import Room, room_tools
from subagents.room._messages import UNREAD_CAP
from subagents.store import StoreError
from subagents.tools import Tool

pytestmark = pytest.mark.anyio


def by_name(tools: tuple[Tool, ...]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


async def test_file_tools_claim_check_drift_and_release(tmp_path: Path) -> None:
    file = tmp_path / "x.py"
    file.write_text("one")
    async with Room(tmp_path / "s.db") as room:
        me = by_name(room_tools(room, (await room.join("r", cwd=str(tmp_path))).member_id))
        other_id = (await room.join("r", cwd=str(tmp_path))).member_id
        other = by_name(room_tools(room, other_id))
        assert set(me) == {
            "claim_file",
            "release_file",
            "check_file",
            "note_read",
            "drift_check",
            "room_send",
            "room_receive",
        }
        assert (await me["note_read"].execute({"path": "x.py"})).details["sha256"]
        claimed = await other["claim_file"].execute({"path": "x.py", "mode": "shared"})
        assert claimed.details["ok"] is True
        refused = await me["claim_file"].execute({"path": "x.py"})
        assert not refused.is_error
        assert refused.details["ok"] is False
        assert "shared by 1" in refused.content
        checked = await me["check_file"].execute('{"path": "x.py"}')
        assert checked.details["free"] is False
        file.write_text("two")
        drift = await me["drift_check"].execute({"path": "x.py"})
        assert drift.details["severity"] == "CRITICAL"
        assert drift.details["holder"] == other_id
        assert (await other["release_file"].execute({"path": "x.py"})).details["released"]


async def test_tool_errors_are_data(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        me = by_name(room_tools(room, (await room.join("r")).member_id))
        ghost = by_name(room_tools(room, "0123456789abcdef"))
        bad = await me["claim_file"].execute({"path": "x", "mode": "mine"})
        assert bad.is_error
        assert bad.details["error"] == "invalid_arguments"
        unknown = await ghost["check_file"].execute({"path": "x"})
        assert unknown.is_error
        assert unknown.details["error"] == "unknown_member"
        missing = await me["note_read"].execute({"path": str(tmp_path / "none.py")})
        assert missing.is_error
        assert missing.details["error"] == "no_file"
        wrong = await me["room_send"].execute({"to": "deadbeef", "body": "x"})
        assert wrong.is_error
        assert wrong.details["error"] == "unknown_member"


async def test_messages_through_the_tools_and_the_unread_rider(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        me = by_name(room_tools(room, (await room.join("r")).member_id))
        them = by_name(room_tools(room, (await room.join("r", autonomy="notify")).member_id))
        empty = await them["room_receive"].execute({})
        assert empty.details["messages"] == []
        assert "no unread messages" in empty.content
        sent = await me["room_send"].execute({"to": "*", "body": "hello", "subject": "hi"})
        assert sent.details["recipients"] != []
        rider = await them["check_file"].execute({"path": "/tmp/anything"})
        assert rider.details["unread"] == 1
        assert "room_receive" in rider.content
        got = await them["room_receive"].execute({"timeout_ms": 10})
        assert [m["body"] for m in got.details["messages"]] == ["hello"]  # type: ignore[index, union-attr]
        after = await them["check_file"].execute({"path": "/tmp/anything"})
        assert "unread" not in after.details
        nobody = await me["room_send"].execute({"to": "tag:none", "body": "x"})
        assert nobody.details["recipients"] == []
        assert "0 member(s)" in nobody.content


async def test_a_closed_room_is_an_error_the_model_can_act_on(tmp_path: Path) -> None:
    """After the room closed (its session ended), a tool answers ``room_closed`` and says
    to carry on without the room, not ``internal`` "try again once"."""
    async with Room(tmp_path / "s.db") as room:
        tools = by_name(room_tools(room, (await room.join("r")).member_id))
    for name, args in (("check_file", {"path": "/tmp/x"}), ("room_receive", {})):
        result = await tools[name].execute(args)
        assert result.is_error
        assert result.details["error"] == "room_closed", result.content
        assert "without them" in result.content


class _Backlog(Room):
    """A room whose members always have ``count`` deliveries waiting."""

    count = UNREAD_CAP

    async def unread(self, member: str) -> int:
        return self.count


@pytest.mark.parametrize(
    ("count", "text", "capped"), [(7, "(7 room", False), (UNREAD_CAP, "(1000 or more room", True)]
)
async def test_the_unread_rider_says_when_the_count_stopped_at_its_cap(
    tmp_path: Path, count: int, text: str, capped: bool
) -> None:
    """``unread`` counts up to 1,000: at the cap the backlog may be larger, and the rider
    says so rather than name a number it does not know."""
    async with _Backlog(tmp_path / "s.db") as room:
        room.count = count
        tools = by_name(room_tools(room, (await room.join("r")).member_id))
        result = await tools["check_file"].execute({"path": "/tmp/x"})
    assert text in result.content
    assert result.details["unread"] == count
    assert result.details["unread_capped"] is capped


async def test_note_read_and_drift_check_of_a_directory_say_so_and_not_internal(
    tmp_path: Path,
) -> None:
    """A directory is the model's mistake: an error about the path it can correct, not an
    ``internal`` failure saying "this is not caused by your arguments. Try again"."""
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", cwd=str(tmp_path))).member_id
        tools = {tool.name: tool for tool in room_tools(room, member)}
        for name in ("note_read", "drift_check"):
            result = await tools[name].execute({"path": "."})
            assert result.is_error
            assert result.details["error"] != "internal", result.content
            assert "not caused by your arguments" not in result.content


class _RiderFails(Room):
    """A room whose ``unread`` (the rider every tool result carries) fails: the store was
    locked for longer than ``busy_timeout`` just after the tool's own call committed."""

    async def unread(self, member: str) -> int:
        raise StoreError(self.path, "locked", "held by another process")


async def test_a_sent_message_is_reported_sent_when_the_unread_rider_fails(
    tmp_path: Path,
) -> None:
    """The send committed: answering it as an error makes the model send it again (a
    duplicate the recipients read twice)."""
    async with _RiderFails(tmp_path / "s.db") as room:
        a = (await room.join("r")).member_id
        b = (await room.join("r")).member_id
        send = next(tool for tool in room_tools(room, a) if tool.name == "room_send")
        result = await send.execute({"to": b, "body": "once"})
        assert not result.is_error, result.content
        assert result.details["message_id"] == 1
