"""``subagents mcp serve --messaging --room PATH`` in a real subprocess: a model over MCP
exchanges messages with a member of another process through the room."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from subagents.room import Room

mcp = pytest.importorskip("mcp")

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ["-m", "subagents", "mcp", "serve", "--agents", "tests.mcp.agents:SPECS"]
ENV = {
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    "PYTHONWARNINGS": "error",
}


async def _server_member(room: Room) -> str:
    # The server joins as it starts, before it answers the client's first call.
    for member in await room.who("default"):
        if member.label == "subagents:root":
            return member.member_id
    raise AssertionError("the server is not a member of the room")


async def test_send_message_and_read_messages_over_mcp_reach_another_process(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    params = mcp.StdioServerParameters(
        command=sys.executable,
        args=[*COMMAND, "--messaging", "--room", str(path)],
        env=ENV,
        cwd=str(ROOT),
    )
    async with Room(path) as room:
        me = (await room.join("default", label="test")).member_id
        async with mcp.Client(params) as client:
            listed = await client.list_tools()
            (send,) = [t for t in listed.tools if t.name == "send_message"]
            assert "room:*" in (send.description or "")
            server = await _server_member(room)
            result = await client.call_tool("send_message", {"to": me, "message": "from mcp"})
            assert result.is_error is False
            with anyio.fail_after(30):
                received = await room.receive(me, timeout=None)
            (message,) = received.messages
            assert (message.body, message.sender) == ("from mcp", server)
            await room.send(me, server, "to mcp", reply_to=message.message_id)
            read = await client.call_tool("read_messages", {"wait_ms": 20_000})
            content = read.structured_content
            assert isinstance(content, dict)
            (got,) = content["messages"]
            assert (got["body"], got["from"]) == ("to mcp", me)


def test_room_without_messaging_is_one_line_naming_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, *COMMAND, "--room", str(tmp_path / "s.db")],
        env={**os.environ, **ENV},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "--room needs --messaging" in done.stderr
