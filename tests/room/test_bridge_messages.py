"""The bridge: the peer-messaging API of one manager reaches another's through a room."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import Request, RunContext, UnknownPeer
from subagents.room import Room, bridge
from tests.helpers import spec
from tests.room.bridge_support import bridged, failed, room_ids, state_of

pytestmark = pytest.mark.anyio


async def test_a_message_sent_with_manager_send_is_received_with_manager_recv(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:
        receipt = a.manager.send(b.link.member_id, "hello")
        assert receipt.state == "queued"
        with anyio.fail_after(30):
            got = await b.manager.recv(timeout=None)
        assert got is not None
        assert (got.body, got.from_, got.to) == ("hello", a.link.member_id, "root")
        assert got.id.startswith("r")
        answer = b.manager.send(got.from_, "hi back", reply_to=got.id)
        assert answer.state == "queued"
        with anyio.fail_after(30):
            back = await a.manager.recv(from_=b.link.member_id, timeout=None)
        assert back is not None
        assert back.body == "hi back"
        assert back.reply_to == receipt.message_id  # the local id of what it answers


async def test_a_reply_threads_back_to_the_child_that_asked(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    member: list[str] = []

    async def asker(request: Request, ctx: RunContext) -> str:
        reply = await ctx.ask(member[0], "what is 6*7?", timeout=30)
        assert reply.outcome == "replied", reply
        assert reply.message is not None
        return reply.message.body

    async with bridged(path, [spec("asker", asker)]) as a, bridged(path) as b:
        member.append(b.link.member_id)
        handle = a.manager.spawn("asker", "go")
        with anyio.fail_after(30):
            question = await b.manager.recv(timeout=None)
        assert question is not None
        assert question.body == "what is 6*7?"
        b.manager.send(question.from_, "42", reply_to=question.id)
        with anyio.fail_after(30):
            result = await a.manager.wait_result(handle.task_id)
        assert result.output == "42", result
        assert a.manager.inbox(peek=True) == []  # it went to the child, not the host


async def test_a_message_is_accepted_in_the_room_when_handed_on_and_read_when_read_locally(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:
        a.manager.send(b.link.member_id, "one")
        with anyio.fail_after(30):
            activity = await b.manager.activity("root", timeout=None)
        assert [m.body for m in activity.messages] == ["one"]
        (sent,) = await a.link.sent()
        await state_of(a, sent.message.message_id, b.link.member_id, "accepted")
        assert [m.body for m in b.manager.inbox()] == ["one"]  # the local read
        await state_of(a, sent.message.message_id, b.link.member_id, "read")


async def test_a_selector_that_reaches_nobody_fails_the_receipt_honestly(tmp_path: Path) -> None:
    async with bridged(tmp_path / "s.db") as a:
        receipt = a.manager.send("tag:nobody", "anyone?")
        assert receipt.state == "queued"
        await failed(a.manager, receipt)
        assert receipt.reason == "unknown"
        assert "0 members" in receipt.detail
        assert "stored" in receipt.detail
        (sent,) = await a.link.sent()
        assert sent.states == {}


async def test_room_star_tag_and_file_selectors_reach_the_members_they_name(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    (tmp_path / "wire.go").write_text("package wire")
    async with bridged(path, tags=["reviewer"]) as a, bridged(path) as b:
        assert (await b.room.claim(b.link.member_id, str(tmp_path / "wire.go"))).ok
        for selector in ("room:*", "tag:reviewer", "file:wire.go"):
            sender, to = (a, b) if selector != "tag:reviewer" else (b, a)
            sender.manager.send(selector, f"via {selector}")
            with anyio.fail_after(30):
                got = await to.manager.recv(timeout=None)
            assert got is not None
            assert got.body == f"via {selector}"
            assert got.from_ == sender.link.member_id


async def test_an_unknown_member_id_fails_its_receipt_with_the_rooms_sentence(
    tmp_path: Path,
) -> None:
    async with bridged(tmp_path / "s.db") as a:
        receipt = a.manager.send("0123456789abcdef", "hello?")
        await failed(a.manager, receipt)
        assert receipt.reason == "unknown"
        assert "0123456789abcdef" in receipt.detail


async def test_a_member_id_without_a_bridge_is_an_unknown_peer_that_says_so(
    tmp_path: Path,
) -> None:
    async with bridged(tmp_path / "s.db") as a:
        with pytest.raises(UnknownPeer, match="no room is bridged"):
            a.manager.send("0123456789abcdef", "hello?", session_id="other")


async def test_leaving_the_bridge_detaches_the_route(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as b, Room(path) as room:
        from subagents import SubagentManager

        async with SubagentManager() as manager:
            async with bridge(room, manager):
                manager.send(b.link.member_id, "while bridged")
            with pytest.raises(UnknownPeer, match="looks like a room member"):
                manager.send(b.link.member_id, "after")


async def test_a_reply_for_a_child_that_ends_unread_goes_to_the_session(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    member: list[str] = []
    asked: list[str] = []
    release = anyio.Event()

    async def leaves(request: Request, ctx: RunContext) -> str:
        asked.append(ctx.send(member[0], "tell me later").message_id)
        await release.wait()
        return "left without reading"

    async with bridged(path, [spec("leaves", leaves)]) as a, bridged(path) as b:
        member.append(b.link.member_id)
        child = a.manager.spawn("leaves", "go")
        with anyio.fail_after(30):
            question = await b.manager.recv(timeout=None)
        assert question is not None
        b.manager.send(question.from_, "later is now", reply_to=question.id)
        (reply_id,) = await room_ids(b, 1)
        await state_of(b, reply_id, a.link.member_id, "accepted")  # in the child's inbox
        release.set()
        await child.wait()
        with anyio.fail_after(30):
            got = await a.manager.recv(timeout=None)
        assert got is not None
        assert (got.body, got.reply_to) == ("later is now", asked[0])
        await state_of(b, reply_id, a.link.member_id, "read")
