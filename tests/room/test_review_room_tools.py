"""Review of the room's tools, command line and close: errors a model can act on, a result
never lost to the rider, a read-only command that reads only, connections closed."""

from __future__ import annotations

import gc
from pathlib import Path

import anyio
import pytest

from subagents._cli import main
from subagents.room import Room, room_tools
from subagents.store import StoreError
from tests.room.support import open_files

pytestmark = pytest.mark.anyio


async def test_note_read_and_drift_check_of_a_directory_say_so_and_not_internal(
    tmp_path: Path,
) -> None:
    """A directory is the model's mistake: an error about the path it can correct, not an
    ``internal`` failure saying "this is not caused by your arguments. Try again"."""
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", cwd=str(tmp_path))).member_id
        tools = {tool.name: tool for tool in room_tools(room, member)}
        for name in ("note_read", "drift_check"):
            result = await tools[name].execute({"path": "."})
            assert result.is_error
            assert result.details["error"] != "internal", result.content
            assert "not caused by your arguments" not in result.content


class _RiderFails(Room):
    """A room whose ``unread`` (the rider every tool result carries) fails: the store was
    locked for longer than ``busy_timeout`` just after the tool's own call committed."""

    async def unread(self, member: str) -> int:
        raise StoreError(self.path, "locked", "held by another process")


async def test_a_sent_message_is_reported_sent_when_the_unread_rider_fails(
    tmp_path: Path,
) -> None:
    """The send committed: answering it as an error makes the model send it again (a
    duplicate the recipients read twice)."""
    async with _RiderFails(tmp_path / "s.db") as room:
        a = (await room.join("r")).member_id
        b = (await room.join("r")).member_id
        send = next(tool for tool in room_tools(room, a) if tool.name == "room_send")
        result = await send.execute({"to": b, "body": "once"})
        assert not result.is_error, result.content
        assert result.details["message_id"] == 1


def test_the_cli_leases_of_a_member_reads_only(tmp_path: Path) -> None:
    """The command's docstring: ``who``, ``history`` and ``leases`` only read. Listing a
    ``notify`` member's leases must not move its stored message to ``accepted``."""
    store = tmp_path / "s.db"

    async def prepare() -> tuple[str, str]:
        async with Room(store) as room:
            sender = (await room.join("r")).member_id
            quiet = (await room.join("r", autonomy="notify")).member_id
            await room.send(sender, quiet, "x")
            return sender, quiet

    async def state(sender: str, quiet: str) -> str:
        async with Room(store) as room:
            (mine,) = await room.sent(sender)
            return mine.states[quiet]

    sender, quiet = anyio.run(prepare)
    assert main(["room", "leases", "--store", str(store), "--member", quiet]) == 0
    assert anyio.run(state, sender, quiet) == "stored"


@pytest.mark.parametrize("anyio_backend", ["trio"])  # asyncio's GC happens to free it
async def test_a_room_closed_in_a_cancelled_scope_closes_its_connection(
    tmp_path: Path,
) -> None:
    """``aclose`` under cancellation raises at its first thread hop (the watcher's join)
    before ``database.close`` runs: the writer connection and its files stay open."""
    room = Room(tmp_path / "s.db")
    with anyio.CancelScope() as scope:
        async with room:
            await room.join("r")
            scope.cancel()
            await anyio.lowlevel.checkpoint()
    gc.collect()
    assert open_files(tmp_path) == []
