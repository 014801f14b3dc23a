"""``subagents room who|history|leases|send --store PATH``: look at and write into the rooms
of a store file from a shell.

``who``, ``history`` and ``leases`` only read: they open the file read-only, so a store
of an older schema is refused rather than migrated, and an empty file is not made a store;
``send`` stores a message as a member (opening read-write, as any process does). A missing
file, an older store, an unknown member id or a bad argument is one line on stderr and
exit status 1; a usage error is status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread

from ._errors import SubagentsError
from ._json import JSONValue, dumps_str
from .room import Room

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the ``room`` command (``who``, ``history``, ``leases``, ``send``)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "room", help="the rooms of a store file: who, history, leases, send"
    )
    sub = parser.add_subparsers(dest="room_command", required=True, metavar="SUBCOMMAND")

    who = sub.add_parser("who", help="the members (of a room), each alive, gone or unknown")
    _common(who)
    who.add_argument("--room", help="only this room's members")
    who.set_defaults(func=_run(_who, read_only=True))

    history = sub.add_parser("history", help="a room's messages, oldest first (marks nothing read)")
    _common(history)
    history.add_argument("--room", required=True)
    history.add_argument("--limit", type=int, default=50, help="the newest N (default 50)")
    history.set_defaults(func=_run(_history, read_only=True))

    leases = sub.add_parser("leases", help="the live leases of a member, or of a path")
    _common(leases)
    which = leases.add_mutually_exclusive_group(required=True)
    which.add_argument("--member", help="a member id")
    which.add_argument("--path", help="a file path (relative: to this directory)")
    leases.set_defaults(func=_run(_leases, read_only=True))

    send = sub.add_parser("send", help="send a message as a member")
    _common(send)
    send.add_argument("--from", dest="sender", required=True, help="the sender's member id")
    send.add_argument("--to", required=True, help="'*', a member id, file:<glob> or tag:<tag>")
    send.add_argument("--subject")
    send.add_argument("--ttl", type=float, help="seconds until an unread copy expires")
    send.add_argument("body", help="the message ('-': read it from stdin)")
    send.set_defaults(func=_run(_send))


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, metavar="PATH", help="the store's file")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


def _run(
    command: Callable[[Room, argparse.Namespace], Awaitable[list[dict[str, JSONValue]] | str]],
    *,
    read_only: bool = False,
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        name = f"subagents room {args.room_command}"
        if not os.path.isfile(args.store):
            print(f"{name}: store {args.store!r}: no store here", file=sys.stderr)
            return 1

        async def main() -> list[dict[str, JSONValue]] | str:
            async with Room(args.store, read_only=read_only) as room:
                return await command(room, args)

        try:
            out = anyio.run(main)
        except SubagentsError as exc:  # StoreError among them
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        if isinstance(out, str):
            print(out)
        else:
            for row in out:
                print(dumps_str(row) if args.json else _line(row))
        return 0

    return run


def _line(row: dict[str, JSONValue]) -> str:
    return "  ".join(f"{key}={_shown(value)}" for key, value in row.items() if value is not None)


def _shown(value: JSONValue) -> str:
    if isinstance(value, float):
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(value))
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


async def _who(room: Room, args: argparse.Namespace) -> list[dict[str, JSONValue]]:
    return [m.to_dict() for m in await room.who(args.room)]


async def _history(room: Room, args: argparse.Namespace) -> list[dict[str, JSONValue]]:
    return [m.to_dict() for m in await room.history(args.room, limit=args.limit)]


async def _leases(room: Room, args: argparse.Namespace) -> list[dict[str, JSONValue]]:
    if args.member is not None:
        return [lease.to_dict() for lease in await room.leases(args.member)]
    return [lease.to_dict() for lease in (await room.check(args.path)).leases]


async def _send(room: Room, args: argparse.Namespace) -> list[dict[str, JSONValue]] | str:
    body = await anyio.to_thread.run_sync(sys.stdin.read) if args.body == "-" else args.body
    sent = await room.send(args.sender, args.to, body, subject=args.subject, ttl=args.ttl)
    row: dict[str, JSONValue] = {
        "message_id": sent.message_id,
        "recipients": list(sent.recipients),
        "warning": sent.warning,
    }
    if args.json:
        return [row]
    text = f"message {sent.message_id} to {len(sent.recipients)} member(s)"
    return text + (f": {sent.warning}" if sent.warning else "")
