"""The bridge's link from a room message to its local sender exists before any reply to
it is routed: a reply the inbound loop sees while the question's commit has not yet
returned to the outbound task still reaches the child that asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents import Request, RunContext, SubagentManager
from subagents.room import Room, bridge
from tests.helpers import spec
from tests.room.bridge_support import bridged

pytestmark = pytest.mark.anyio


async def test_a_reply_seen_before_its_questions_commit_returned_reaches_the_asker(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    member: list[str] = []
    peeked_reply = anyio.Event()

    async def asker(request: Request, ctx: RunContext) -> str:
        reply = await ctx.ask(member[0], "what is 6*7?", timeout=60)
        assert reply.outcome == "replied", reply
        assert reply.message is not None
        return reply.message.body

    async with Room(path) as room, bridged(path) as b:
        member.append(b.link.member_id)
        send, peek = room.send, room.peek

        async def held_send(*args: Any, **kwargs: Any) -> Any:
            sent = await send(*args, **kwargs)  # committed: b can read and answer it
            with anyio.move_on_after(30):  # (bounded, should it never come)
                await peeked_reply.wait()  # it returns only once the reply was seen
            return sent

        async def watched_peek(*args: Any, **kwargs: Any) -> Any:
            found = await peek(*args, **kwargs)
            if any(m.reply_to is not None for m in found):
                peeked_reply.set()
            return found

        room.send = held_send  # type: ignore[method-assign]
        room.peek = watched_peek  # type: ignore[method-assign]
        async with SubagentManager([spec("asker", asker)]) as manager, bridge(room, manager):
            handle = manager.spawn("asker", "go")
            with anyio.fail_after(30):
                question = await b.manager.recv(timeout=None)
            assert question is not None
            b.manager.send(question.from_, "42", reply_to=question.id)
            with anyio.fail_after(60):
                result = await manager.wait_result(handle.task_id)
            assert peeked_reply.is_set()
            assert result.output == "42", result
            assert manager.inbox(peek=True) == []  # it went to the child, not the host
