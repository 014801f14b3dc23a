"""The bridge and local task ids: a task id of this manager (12 hex characters, the
shape of a truncated member id) that the sender's tree no longer knows stays a local
unknown peer, as it is without a bridge; it is not carried to the room."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import Request, RunContext, UnknownPeer
from tests.helpers import spec
from tests.room.bridge_support import bridged

pytestmark = pytest.mark.anyio


async def _quick(request: Request, ctx: RunContext) -> str:
    return "done"


async def test_a_send_to_a_forgotten_local_task_raises_unknown_peer(tmp_path: Path) -> None:
    async with bridged(tmp_path / "s.db", [spec("quick", _quick)]) as a:
        handle = a.manager.spawn("quick", "go")
        await handle.wait()
        a.manager.forget(handle.task_id)
        with pytest.raises(UnknownPeer):
            a.manager.send(handle.task_id, "hello")


async def test_an_ask_of_a_forgotten_local_task_raises_unknown_peer(tmp_path: Path) -> None:
    async with bridged(tmp_path / "s.db", [spec("quick", _quick)]) as a:
        handle = a.manager.spawn("quick", "go")
        await handle.wait()
        a.manager.forget(handle.task_id)
        with anyio.fail_after(2), pytest.raises(UnknownPeer):
            await a.manager.ask(handle.task_id, "are you there?")
