"""The bridge and the local inbox: a full one leaves the room's messages in the room (none
dropped, FIFO kept); an ask to a remote member gets its reply; a bridge that exits ends
what waited on it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import ConfigError, SubagentManager, UnknownPeer
from subagents.room import Room, bridge
from tests.room.bridge_support import bridged, failed, room_ids, state_of

pytestmark = pytest.mark.anyio


async def test_a_full_local_inbox_leaves_the_rest_in_the_room_and_drops_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path, inbox_capacity=2) as b:
        for i in range(5):
            a.manager.send(b.link.member_id, f"m{i}")
        ids = await room_ids(a, 5)
        member = b.link.member_id
        await state_of(a, ids[1], member, "accepted")  # two handed on: the inbox is full
        assert [m.body for m in b.manager.inbox(peek=True)] == ["m0", "m1"]
        states = {s.message.message_id: s.states[member] for s in await a.link.sent(limit=5)}
        assert [states[i] for i in ids[2:]] == ["offered"] * 3  # still in the room, untaken
        got = []
        with anyio.fail_after(30):
            while len(got) < 5:
                message = await b.manager.recv(timeout=None)
                assert message is not None
                got.append(message.body)
        assert got == [f"m{i}" for i in range(5)]  # every one, in order
        await state_of(a, ids[4], member, "read")


async def test_ask_to_a_remote_member_returns_its_reply(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:

        async def answer() -> None:
            question = await b.manager.recv(timeout=None)
            assert question is not None
            b.manager.send(question.from_, question.body.upper(), reply_to=question.id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(answer)
            with anyio.fail_after(30):
                reply = await a.manager.ask(f"room:{b.link.member_id}", "ping", timeout=30)
        assert reply.outcome == "replied"
        assert reply.message is not None
        assert (reply.message.body, reply.message.from_) == ("PING", b.link.member_id)
        assert a.manager.inbox(peek=True) == []  # the reply went to the ask, not the inbox


async def test_an_ask_cannot_await_a_selector(tmp_path: Path) -> None:
    async with bridged(tmp_path / "s.db") as a:
        with pytest.raises(ConfigError, match="one member's id"):
            await a.manager.ask("room:*", "anyone?", timeout=1)


async def test_an_ask_waiting_on_a_remote_member_ends_closed_when_the_bridge_exits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as b, Room(path) as room, SubagentManager() as manager:
        outcome: list[str] = []
        done = anyio.Event()

        async def ask() -> None:
            reply = await manager.ask(b.link.member_id, "still there?", timeout=60)
            outcome.append(reply.outcome)
            done.set()

        async with anyio.create_task_group() as tg:
            async with bridge(room, manager):
                tg.start_soon(ask)
                with anyio.fail_after(30):
                    assert await b.manager.recv(timeout=None) is not None  # never answered
            with anyio.fail_after(30):
                await done.wait()  # at the bridge's exit, not at the ask's timeout
        assert outcome == ["closed"]


async def test_a_room_closed_under_the_bridge_ends_it_quietly(tmp_path: Path) -> None:
    async with bridged(tmp_path / "s.db") as a:
        await a.room.aclose()
        receipt = a.manager.send("0123456789abcdef", "anyone?")
        await failed(a.manager, receipt)
        assert receipt.reason == "closed"
        later = a.manager.send("0123456789abcdef", "still?")  # the route stays, refusing
        assert later.reason == "closed"
    # leaving raised nothing: the bridge's tasks ended, logged


async def test_a_cancelled_bridge_leaves_cleanly_and_detaches(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with Room(path) as room, SubagentManager() as manager:
        with anyio.CancelScope() as scope:
            async with bridge(room, manager):
                scope.cancel()
                await anyio.sleep_forever()
        assert scope.cancelled_caught
        with pytest.raises(UnknownPeer):
            manager.send("0123456789abcdef", "after")
