"""The bridge and ``from_``: a room member id filters what a session reads; a room
selector names no one sender, so it is refused rather than matching nothing forever."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import SubagentsError
from tests.room.bridge_support import bridged

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("selector", ["room:*", "tag:reviewer", "file:wire.go"])
async def test_a_room_selector_as_from_is_refused_not_matched_against_nothing(
    tmp_path: Path, selector: str
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path, tags=["reviewer"]) as b:
        b.manager.send(a.link.member_id, "hello")
        with anyio.fail_after(30):
            assert await a.manager.activity("root", timeout=None)
        assert [m.from_ for m in a.manager.inbox(peek=True)] == [b.link.member_id]
        with pytest.raises(SubagentsError, match="from_"):
            a.manager.inbox(peek=True, from_=selector)
        with pytest.raises(SubagentsError, match="from_"):
            await a.manager.recv(from_=selector, timeout=0)
