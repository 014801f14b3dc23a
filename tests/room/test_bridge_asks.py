"""The bridge: an ``ask`` to a room member ends as soon as its question cannot reach it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import SubagentManager
from subagents.room import Room, bridge
from tests.room.bridge_support import bridged

pytestmark = pytest.mark.anyio


async def test_an_ask_to_an_unknown_member_id_ends_unknown_without_waiting_for_its_timeout(
    tmp_path: Path,
) -> None:
    async with bridged(tmp_path / "s.db") as a:
        with anyio.fail_after(5):
            reply = await a.manager.ask("0123456789abcdef", "anyone?", timeout=None)
        assert reply.outcome == "unknown", reply
        assert reply.receipt.reason == "unknown"


async def test_one_sessions_bridge_exiting_leaves_another_sessions_ask_to_the_same_member(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    outcomes: dict[str, str] = {}
    root_done = anyio.Event()

    async with (
        bridged(path) as b,
        Room(path) as room_root,
        Room(path) as room_other,
        SubagentManager() as manager,
        bridge(room_other, manager, "other"),
    ):

        async def ask(session_id: str, done: anyio.Event | None) -> None:
            reply = await manager.ask(
                b.link.member_id, session_id, timeout=30, session_id=session_id
            )
            outcomes[session_id] = reply.outcome
            if done is not None:
                done.set()

        async with anyio.create_task_group() as tg:
            async with bridge(room_root, manager, "root"):
                tg.start_soon(ask, "root", root_done)
                tg.start_soon(ask, "other", None)
                questions = {}
                with anyio.fail_after(30):
                    for _ in range(2):
                        question = await b.manager.recv(timeout=None)
                        assert question is not None
                        questions[question.body] = question
            with anyio.fail_after(30):
                await root_done.wait()  # ended closed with its own bridge
            question = questions["other"]
            b.manager.send(question.from_, "still here", reply_to=question.id)
        assert outcomes == {"root": "closed", "other": "replied"}


async def test_send_message_awaiting_a_reply_from_an_unknown_member_says_unknown_at_once(
    tmp_path: Path,
) -> None:
    from subagents.tools import build_tools

    async with bridged(tmp_path / "s.db") as a:
        tools = build_tools(a.manager, "root", messaging=True)
        with anyio.fail_after(5):  # well below the tool's own ceiling
            result = await tools.call(
                "send_message",
                {"to": "0123456789abcdef", "message": "anyone?", "await_reply_ms": 600_000},
            )
        assert result.details["reply_outcome"] == "unknown", result.content
