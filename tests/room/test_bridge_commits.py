"""The bridge's commit of a send, seen at send time: ``RoomLink.committed`` and the
``send_message`` tool say how many members the room reached (0 included: no error), while
``manager.send`` itself never waits."""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents.tools import build_tools
from tests.room.bridge_support import bridged, failed

pytestmark = pytest.mark.anyio


async def test_committed_says_how_many_members_a_bridged_send_reached(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path, tags=["reviewer"]) as b:
        receipt = a.manager.send(b.link.member_id, "one")
        assert receipt.state == "queued"  # the send itself did not wait
        assert await a.link.committed(receipt) == 1
        nobody = a.manager.send("tag:nobody", "anyone?")
        assert await a.link.committed(nobody) == 0
        assert nobody.reason == "unknown"
        assert "0 members" in nobody.detail


async def test_send_message_to_a_room_reports_its_recipients_as_data(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path, tags=["reviewer"]):
        tools = build_tools(a.manager, "root", messaging=True)
        reached = await tools.call("send_message", {"to": "tag:reviewer", "message": "x"})
        assert not reached.is_error, reached.content
        assert reached.details["room_recipients"] == 1
        assert "for 1 recipient(s)" in reached.content
        nobody = await tools.call("send_message", {"to": "tag:nobody", "message": "x"})
        assert not nobody.is_error, nobody.content  # a selector reaching nobody is no error
        assert nobody.details["room_recipients"] == 0
        assert "reached nobody" in nobody.content
        assert nobody.details["receipts"][0]["reason"] == "unknown"  # the receipt as before


async def test_a_local_send_message_has_no_room_recipients(tmp_path: Path) -> None:
    async with bridged(tmp_path / "s.db") as a:
        tools = build_tools(a.manager, "root", messaging=True)
        result = await tools.call("send_message", {"to": "*", "message": "x"})
        assert "room_recipients" not in result.details


async def test_a_store_error_in_a_commit_fails_its_receipt_closed_and_stops_the_bridge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from subagents.store import StoreError

    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:

        async def broken(*args: object, **kwargs: object) -> None:
            raise StoreError(str(path), "failed", "disk I/O error")

        monkeypatch.setattr(a.room, "send", broken)
        receipt = a.manager.send(b.link.member_id, "one")
        await failed(a.manager, receipt)
        assert receipt.reason == "closed", receipt.detail  # the store, not the address
        assert "disk I/O error" in receipt.detail
        later = a.manager.send(b.link.member_id, "two")
        assert later.reason == "closed"  # the bridge stopped
