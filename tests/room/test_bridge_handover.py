"""The bridge's hand-over to a child: a room message handed to a child that ends before
reading it goes to the session, even when the session's inbox is full at that moment."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import Request, RunContext
from tests.helpers import spec
from tests.room.bridge_support import bridged, room_ids, state_of

pytestmark = pytest.mark.anyio


async def test_a_reply_left_by_an_ended_child_reaches_the_session_once_its_full_inbox_drains(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    member: list[str] = []
    gate = anyio.Event()

    async def asker(request: Request, ctx: RunContext) -> str:
        ctx.send(member[0], "question")
        await gate.wait()
        return "left without reading"  # its reply, handed to it, is never read here

    async with (
        bridged(path, [spec("asker", asker)], inbox_capacity=1) as a,
        bridged(path) as b,
    ):
        member.append(b.link.member_id)
        handle = a.manager.spawn("asker", "go")
        with anyio.fail_after(30):
            question = await b.manager.recv(timeout=None)
        assert question is not None
        b.manager.send(a.link.member_id, "fills the session's inbox")
        b.manager.send(question.from_, "the answer", reply_to=question.id)
        fill, answer = await room_ids(b, 2)
        await state_of(b, fill, a.link.member_id, "accepted")
        await state_of(b, answer, a.link.member_id, "accepted")  # in the child's inbox
        gate.set()
        with anyio.fail_after(30):
            await a.manager.wait_result(handle.task_id)
        assert [m.body for m in a.manager.inbox()] == ["fills the session's inbox"]
        with anyio.fail_after(2):
            got = await a.manager.recv(timeout=None)
        assert got is not None
        assert got.body == "the answer"
