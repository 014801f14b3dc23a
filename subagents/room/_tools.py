"""The room's tools for a model: ``claim_file``, ``release_file``, ``check_file``,
``note_read``, ``drift_check``, ``room_send`` and ``room_receive``, bound to one member.

The member id is bound when the tools are built, never an argument: a model cannot pass
its harness key, or another member's id, where its own belongs. Errors are data (a
:class:`~subagents.tools.ToolResult` with ``is_error``), as for every tool. Each result
carries ``unread`` when messages wait for the member: the signal of a member below
``wake`` rides on the turn it makes anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

import anyio

from .._errors import SubagentsError
from .._json import JSONValue
from .._tool_tracing import ToolSpan
from ..tools import Tool, ToolResult
from ..tools._schema import Param
from ..tools._tool import make_tool
from ._ids import UnknownMember
from ._leases import LeaseNotHeld
from ._messages import UNREAD_CAP
from ._records import LeaseMode
from ._room import Room

__all__ = ["room_tools"]

logger = logging.getLogger("subagents.room")

_OBJECT: Final[dict[str, JSONValue]] = {"type": "object"}
_PATH = Param(
    name="path",
    kind="string",
    description="The file's path, absolute or relative to your working directory.",
    required=True,
    min_length=1,
    max_length=4096,
)
_TTL = Param(
    name="ttl_s",
    kind="integer",
    description="Seconds the lease lasts (default 300); claim again to renew it.",
    minimum=1,
    default=300,
)

Call = Callable[[dict[str, object]], Awaitable[ToolResult]]


class _Handlers:
    """The tools' handlers, acting as one member."""

    def __init__(self, room: Room, member: str, engine_timeout: float | None) -> None:
        self.room = room
        self.member = member
        self.engine_timeout = engine_timeout

    def tool(
        self,
        name: str,
        title: str,
        description: str,
        params: list[Param],
        call: Call,
        *,
        reads: bool,
    ) -> Tool:
        room, member = self.room, self.member

        async def handler(args: dict[str, object], span: ToolSpan) -> ToolResult:
            try:
                result = await call(args)
            except anyio.ClosedResourceError:
                return _error(
                    "the room is closed (its session ended or is ending): the room's tools "
                    "no longer work; carry on without them",
                    "room_closed",
                )
            except UnknownMember as exc:
                return _error(str(exc), "unknown_member", suggestions=list(exc.suggestions))
            except LeaseNotHeld as exc:
                return _error(str(exc), "not_held")
            except FileNotFoundError as exc:
                return _error(f"no file at {exc.args[0] if exc.args else 'that path'}", "no_file")
            except OSError as exc:  # a directory, no permission: the path is the mistake
                where = exc.filename or args.get("path")
                return _error(f"cannot read {where}: {exc.strerror or exc}", "unreadable")
            if name == "room_receive":
                return result
            try:
                unread = await room.unread(member)
            except SubagentsError:
                # The call itself succeeded (a send is stored): its result stands, the
                # rider is left off rather than turn it into an error to retry.
                logger.warning("the room's unread count failed after %s", name, exc_info=True)
                return result
            if not unread:
                return result
            # The count stops at its cap: at it, the backlog may be larger.
            many = f"{unread} or more" if unread >= UNREAD_CAP else str(unread)
            return ToolResult(
                content=f"{result.content}\n({many} room message(s) wait: call room_receive)",
                details={**result.details, "unread": unread, "unread_capped": unread >= UNREAD_CAP},
                is_error=result.is_error,
            )

        return make_tool(
            name=name,
            title=title,
            description=description,
            params=params,
            output_schema=_OBJECT,
            handler=handler,
            annotations={"readOnlyHint": reads, "openWorldHint": False},
            engine_timeout=self.engine_timeout,
        )

    async def claim(self, args: dict[str, object]) -> ToolResult:
        mode: LeaseMode = "shared" if args.get("mode") == "shared" else "exclusive"
        ttl = float(str(args.get("ttl_s") or 300))
        got = await self.room.claim(self.member, str(args["path"]), mode=mode, ttl=ttl)
        if got.ok:
            assert got.lease is not None
            return ToolResult(
                content=f"claimed {got.path} ({mode}) for {ttl:g} s",
                details={"ok": True, "lease": got.lease.to_dict()},
            )
        holder = got.holder.to_dict() if got.holder is not None else None
        return ToolResult(
            content=f"not claimed: {got.path} is {got.reason}; wait, or ask its holder "
            "(room_send with to=file:<path>)",
            details={"ok": False, "reason": got.reason, "holder": holder},
        )

    async def release(self, args: dict[str, object]) -> ToolResult:
        held = await self.room.release(self.member, str(args["path"]))
        text = "released" if held else "you held no live lease on it: nothing to release"
        return ToolResult(content=text, details={"released": held})

    async def check(self, args: dict[str, object]) -> ToolResult:
        found = await self.room.check(str(args["path"]), member=self.member)
        leases: list[JSONValue] = [lease.to_dict() for lease in found.leases]
        if found.free:
            text = f"{found.path} is free"
        else:
            who = ", ".join(f"{lease.member_id} ({lease.mode})" for lease in found.leases)
            text = f"{found.path} is leased by {who}"
        return ToolResult(
            content=text, details={"path": found.path, "free": found.free, "leases": leases}
        )

    async def note(self, args: dict[str, object]) -> ToolResult:
        digest = await self.room.note_read(self.member, str(args["path"]))
        return ToolResult(
            content=f"baseline recorded (sha256 {digest[:12]}…)", details={"sha256": digest}
        )

    async def drift(self, args: dict[str, object]) -> ToolResult:
        found = await self.room.drift_check(self.member, str(args["path"]))
        return ToolResult(content=f"{found.severity}: {found.message}", details=found.to_dict())

    async def send(self, args: dict[str, object]) -> ToolResult:
        ttl = args.get("ttl_s")
        sent = await self.room.send(
            self.member,
            str(args["to"]),
            str(args["body"]),
            subject=None if args.get("subject") is None else str(args["subject"]),
            ttl=None if ttl is None else float(str(ttl)),
        )
        text = f"message {sent.message_id} delivered to {len(sent.recipients)} member(s)"
        if sent.warning:
            text += f" ({sent.warning})"
        recipients: list[JSONValue] = list(sent.recipients)
        return ToolResult(
            content=text, details={"message_id": sent.message_id, "recipients": recipients}
        )

    async def receive(self, args: dict[str, object]) -> ToolResult:
        limit = int(str(args.get("limit") or 20))
        timeout = int(str(args.get("timeout_ms") or 0)) / 1000
        if self.engine_timeout is not None:
            timeout = min(timeout, max(0.0, self.engine_timeout - 1.0))
        got = await self.room.receive(self.member, limit=min(limit, 1000), timeout=timeout)
        if got.inbox is not None:
            box = got.inbox
            return ToolResult(
                content=f"no unread messages for {box.member_id} in rooms "
                f"{', '.join(box.rooms) or '(none)'}: {box.deliveries} delivered ever, "
                f"{box.read} read",
                details={"messages": [], "inbox": box.to_dict()},
            )
        messages: list[JSONValue] = [m.to_dict() for m in got.messages]
        lines = [
            f"[{m.message_id}] from {m.sender}: {m.subject or ''} {m.body}" for m in got.messages
        ]
        return ToolResult(content="\n".join(lines), details={"messages": messages})


def room_tools(room: Room, member: str, *, engine_timeout: float | None = None) -> tuple[Tool, ...]:
    """The room's tools acting as ``member`` (a member id from :meth:`Room.join`)."""
    mode = Param(
        name="mode",
        kind="enum",
        choices=("exclusive", "shared"),
        description="exclusive (default): nobody else may claim it; shared: others may "
        "share it, nobody may take it exclusively.",
        default="exclusive",
    )
    h = _Handlers(room, member, engine_timeout)
    return (
        h.tool(
            "claim_file",
            "Claim a file",
            "Take a lease on a file before you edit it, so other agents on this machine "
            "do not edit it at the same time. Answers ok, or who holds it.",
            [_PATH, mode, _TTL],
            h.claim,
            reads=False,
        ),
        h.tool(
            "release_file",
            "Release a file",
            "Give back your lease on a file.",
            [_PATH],
            h.release,
            reads=False,
        ),
        h.tool(
            "check_file",
            "Check a file's leases",
            "Whether a file is free or leased, and by whom. Changes nothing.",
            [_PATH],
            h.check,
            reads=True,
        ),
        h.tool(
            "note_read",
            "Note a file as read",
            "Record the file's content hash as you read it now: drift_check compares "
            "against it before you write.",
            [_PATH],
            h.note,
            reads=False,
        ),
        h.tool(
            "drift_check",
            "Check a file for drift",
            "Before writing a file you read earlier: SAFE (unchanged, or never noted), "
            "MINOR (changed, nobody else held a lease) or CRITICAL (changed while another "
            "agent held a lease on it: read it again first).",
            [_PATH],
            h.drift,
            reads=True,
        ),
        h.tool(
            "room_send",
            "Send a room message",
            "Send a message to other agents of your rooms, on any process of this machine. "
            "to: '*' (everyone else), a member id, 'file:<glob>' (holders of a lease on "
            "matching files) or 'tag:<tag>'. Answers how many it reached (0 is possible).",
            [
                Param(
                    name="to",
                    kind="string",
                    description="The selector.",
                    required=True,
                    min_length=1,
                    max_length=4096,
                ),
                Param(
                    name="body",
                    kind="string",
                    description="The message.",
                    required=True,
                    max_length=256 * 1024,
                ),
                Param(
                    name="subject", kind="string", description="A short subject.", max_length=200
                ),
                Param(
                    name="ttl_s",
                    kind="integer",
                    minimum=1,
                    description="Seconds until an unread copy expires (default: never).",
                ),
            ],
            h.send,
            reads=False,
        ),
        h.tool(
            "room_receive",
            "Receive room messages",
            "Take your unread room messages (each marked read), waiting up to timeout_ms "
            "for one when there is none. Empty, it says where it looked.",
            [
                Param(
                    name="limit",
                    kind="integer",
                    minimum=1,
                    default=20,
                    description="The most messages to take.",
                ),
                Param(
                    name="timeout_ms",
                    kind="integer",
                    minimum=0,
                    default=0,
                    description="How long to wait for a message (default: do not wait).",
                ),
            ],
            h.receive,
            reads=False,
        ),
    )


def _error(text: str, code: str, **extra: JSONValue) -> ToolResult:
    return ToolResult(content=text, details={"error": code, **extra}, is_error=True)
