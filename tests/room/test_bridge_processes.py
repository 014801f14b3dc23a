"""The bridge between real processes on one store file: manager.send in one, manager.recv
in another; a process killed (SIGKILL) after the hand-over and before the local read gets
the message again when it comes back with the same harness key."""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
import pytest

from subagents.room import Room
from tests.room.support import BRIDGE_WORKER, room_worker, until_committed

pytestmark = pytest.mark.anyio


async def _states(room: Room, sender: str, message_id: int) -> dict[str, str]:
    for sent in await room.sent(sender, limit=50):
        if sent.message.message_id == message_id:
            return dict(sent.states)
    raise AssertionError(f"no message {message_id}")


async def _until(room: Room, sender: str, message_id: int, expected: dict[str, str]) -> None:
    # The other process's commit, looked at again after each commit until it lands.
    async def holds() -> bool:
        return await _states(room, sender, message_id) == expected

    with anyio.fail_after(60):
        await until_committed(room, holds)


async def test_manager_send_in_one_process_reaches_manager_recv_in_another(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with (
        room_worker(path, script=BRIDGE_WORKER) as a,
        room_worker(path, script=BRIDGE_WORKER, backend="trio") as b,
    ):
        member_a, member_b = await a.call("member"), await b.call("member")
        await b.submit("recv", timeout=None)
        local = await a.call("send", to=member_b, body="across processes")
        got = await b.answer()
        assert isinstance(got, dict)
        assert (got["body"], got["from"]) == ("across processes", member_a)
        await a.submit("recv", timeout=None, from_=member_b)
        await b.call("send", to=member_a, body="and back", reply_to=got["id"])
        back = await a.answer()
        assert isinstance(back, dict)
        assert (back["body"], back["reply_to"]) == ("and back", local)


async def test_a_process_killed_before_its_local_read_gets_the_message_again(
    tmp_path: Path,
) -> None:
    path, key = tmp_path / "s.db", str(uuid.uuid4())
    extra = ["--harness-key", key]
    async with Room(path) as room:
        sender = (await room.join("default", label="sender")).member_id
        async with room_worker(path, script=BRIDGE_WORKER, extra=extra) as b:
            member = await b.call("member")
            sent = await room.send(sender, str(member), "do not lose me")
            waiting = await b.call("wait")  # handed into the local inbox, not read
            assert [m["body"] for m in waiting] == ["do not lose me"]  # type: ignore[index, union-attr]
            await _until(room, sender, sent.message_id, {str(member): "accepted"})
            b.process.kill()
            assert await b.process.wait() == -9
        assert await _states(room, sender, sent.message_id) == {str(member): "accepted"}
        async with room_worker(path, script=BRIDGE_WORKER, extra=extra, backend="trio") as again:
            assert await again.call("member") == member  # the same member
            got = await again.call("recv", timeout=None)
            assert isinstance(got, dict)
            assert got["body"] == "do not lose me"
            await _until(room, sender, sent.message_id, {str(member): "read"})
