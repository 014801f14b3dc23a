"""The bridge stopping under a pending ask: once the route brings nothing in, the reply
an ask waits for cannot come, so the ask ends at once (``closed``), as on detach."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import Reply
from tests.room.bridge_support import bridged, room_ids

pytestmark = pytest.mark.anyio


async def test_an_ask_committed_before_the_bridge_stopped_ends_closed_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:
        replies: list[Reply] = []
        ended = anyio.Event()

        async def asker() -> None:
            replies.append(await a.manager.ask(b.link.member_id, "are you there?", timeout=None))
            ended.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(asker)
            await room_ids(a, 1)  # committed: only the reply is awaited now
            await a.room.aclose()  # the bridge's tasks stop: no reply can come in
            with anyio.move_on_after(1):
                await ended.wait()
            tg.cancel_scope.cancel()
        assert [r.outcome for r in replies] == ["closed"]
