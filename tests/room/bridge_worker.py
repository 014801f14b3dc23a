"""A process of its own whose manager's ``root`` session is bridged to a room, driven by
JSON lines (as ``worker.py``).

    python tests/room/bridge_worker.py PATH [--backend asyncio|trio] [--harness-key KEY]

Ops: ``member`` (the member id), ``send`` (``to``, ``body``, ``reply_to``: the local
message id), ``recv`` (``timeout``, ``from_``: the message taken), ``wait`` (until a
message waits: the waiting ones, peeked), ``peek`` (the waiting ones) and ``sent`` (the
room's states of this member's messages). ``"ready"`` comes first; end of stdin ends it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio

from subagents import Message, SubagentManager
from subagents._json import JSONValue
from subagents.room import Room, RoomLink, bridge
from tests.room.worker import answer_lines


def shown(message: Message | None) -> JSONValue:
    return None if message is None else message.to_dict()


async def call(
    manager: SubagentManager, link: RoomLink, op: str, args: dict[str, object]
) -> JSONValue:
    if op == "member":
        return link.member_id
    if op == "send":
        reply_to = args.get("reply_to")
        receipt = manager.send(
            str(args["to"]), str(args["body"]), reply_to=None if reply_to is None else str(reply_to)
        )
        return receipt.message_id
    if op == "recv":
        timeout = args.get("timeout")
        sender = args.get("from_")
        got = await manager.recv(
            timeout=None if timeout is None else float(str(timeout)),
            from_=None if sender is None else str(sender),
        )
        return shown(got)
    if op == "wait":
        activity = await manager.activity("root", timeout=None)
        return [m.to_dict() for m in activity.messages]
    if op == "peek":
        return [m.to_dict() for m in manager.inbox(peek=True)]
    if op == "sent":
        return [
            {"message_id": s.message.message_id, "states": dict(s.states)}
            for s in await link.sent()
        ]
    raise ValueError(f"unknown op {op!r}")


async def main(path: str, harness_key: str | None) -> None:
    async with (
        Room(path) as room,
        SubagentManager() as manager,
        bridge(room, manager, harness_key=harness_key) as link,
    ):

        async def answer(op: str, request: dict[str, Any]) -> object:
            return await call(manager, link, op, request)

        await answer_lines(answer)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--backend", default="asyncio")
    parser.add_argument("--harness-key", default=None)
    ns = parser.parse_args()
    anyio.run(main, ns.path, ns.harness_key, backend=ns.backend)
