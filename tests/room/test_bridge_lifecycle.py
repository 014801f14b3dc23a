"""The bridge's life: what a refused bridge leaves in the room, and what a stopped one
leaves the host waiting on."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import ConfigError, SubagentManager
from subagents.room import Room, bridge
from tests.room.bridge_support import bridged, failed

pytestmark = pytest.mark.anyio


async def test_a_bridge_refused_for_a_bridged_session_joins_no_member(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with Room(path) as room, SubagentManager() as manager:
        async with bridge(room, manager) as link:
            with pytest.raises(RuntimeError, match="attached already"):
                async with bridge(room, manager):
                    pass
            members = [m.member_id for m in await room.who("default")]
        assert members == [link.member_id]  # no second member that nothing reads for


async def test_activity_of_a_host_whose_bridge_stopped_returns_at_once(tmp_path: Path) -> None:
    async with bridged(tmp_path / "s.db") as a:
        await a.room.aclose()  # the bridge's tasks stop: nothing can come from the room
        receipt = a.manager.send("0123456789abcdef", "anyone?")
        await failed(a.manager, receipt)
        with anyio.fail_after(2):
            activity = await a.manager.activity("root", timeout=None)
        assert activity.messages == []
        assert activity.results == []


@pytest.mark.parametrize("session_id", [123, "", "   "])
async def test_a_bridge_refuses_a_session_id_that_is_not_one_naming_the_field(
    tmp_path: Path, session_id: object
) -> None:
    async with Room(tmp_path / "s.db") as room, SubagentManager() as manager:
        with pytest.raises(ConfigError, match="session_id"):
            async with bridge(room, manager, session_id):  # type: ignore[arg-type]
                pass
        assert await room.who("default") == ()  # refused before it joined
