"""send_message and read_messages across two managers bridged to one store file."""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents.tools import build_tools
from tests.room.bridge_support import bridged

pytestmark = pytest.mark.anyio


async def test_send_message_in_one_manager_reaches_read_messages_in_another(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:
        mine = build_tools(a.manager, "root", messaging=True)
        theirs = build_tools(b.manager, "root", messaging=True)
        sent = await mine.call("send_message", {"to": b.link.member_id, "message": "review?"})
        assert not sent.is_error, sent.content
        assert sent.details["receipts"][0]["state"] == "queued"  # type: ignore[index]
        read = await theirs.call("read_messages", {"from": a.link.member_id, "wait_ms": 20_000})
        assert not read.is_error, read.content
        (message,) = read.details["messages"]  # type: ignore[misc]
        assert message["body"] == "review?"  # type: ignore[index]
        assert message["from"] == a.link.member_id  # type: ignore[index]
        answer = await theirs.call(
            "send_message",
            {"to": a.link.member_id, "message": "lgtm", "reply_to": message["id"]},  # type: ignore[index]
        )
        assert not answer.is_error, answer.content
        back = await mine.call("read_messages", {"wait_ms": 20_000})
        (reply,) = back.details["messages"]  # type: ignore[misc]
        assert reply["reply_to"] == sent.details["message_id"]  # type: ignore[index]


async def test_the_tools_say_what_a_bridged_room_reaches(tmp_path: Path) -> None:
    async with bridged(tmp_path / "s.db") as a:
        tools = build_tools(a.manager, "root", messaging=True)
        description = tools["send_message"].description
        assert "room:*" in description
        assert "file:<glob>" in description
        assert "tag:<tag>" in description
        unbridged = build_tools(a.manager, "other", messaging=True)
        assert "room:*" not in unbridged["send_message"].description


async def test_a_member_id_without_a_room_comes_back_as_data_saying_so(tmp_path: Path) -> None:
    async with bridged(tmp_path / "s.db") as a:
        tools = build_tools(a.manager, "other", messaging=True)
        result = await tools.call("send_message", {"to": "0123456789abcdef", "message": "x"})
        assert result.is_error
        assert "no room is bridged" in result.content
