"""The messaging tools of one session: ``send_message``, ``read_messages`` and
``send_input``.

They act as the session's own address (a host session, or inside a runner the child's
task id): what :meth:`RunContext.send` and :meth:`RunContext.recv` do, for a model. A wait
(``read_messages``' ``wait_ms``, ``send_message``'s ``await_reply_ms``) is clamped below
the tool's host timeout, like ``wait_agent``'s. See design/messaging.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import anyio

from .._envelope import bound_text, cut_middle
from .._handle import handle_of
from .._json import JSONValue
from .._manager import messaging_of, messenger_of
from .._messages import MAX_MESSAGE_CHARS, Message, Receipt
from .._tool_tracing import ToolSpan
from ._handlers import hints
from ._output import output_schema
from ._schema import Param, ms
from ._tool import Handler, Tool, ToolLimits, ToolResult, make_tool

if TYPE_CHECKING:
    from .._manager import SubagentManager

__all__ = ["MESSAGE_TOOL_NAMES", "WAITING_TOOL_NAMES", "build_message_tools"]

MESSAGE_TOOL_NAMES: Final = ("send_message", "read_messages", "send_input")
WAITING_TOOL_NAMES: Final = ("send_message", "read_messages")
"""The messaging tools that wait (each with a ceiling under its host timeout)."""
_ADDRESS_MAX: Final = 512
_ROOM: Final = 200
"""Characters of a read_messages answer kept for its other lines."""


def _message_line(message: Message, share: int | None) -> str:
    """One message as a line, its body shortened (and said so) past ``share`` characters."""
    head = f"[{message.id}] from {message.from_}"
    if message.reply_to is not None:
        head += f" (reply to {message.reply_to})"
    if message.subject is not None:
        head += f" re {message.subject!r}"
    body = message.body
    room = len(body) if share is None else max(share - len(head) - 2, 20)
    if len(body) > room:
        body = cut_middle(body, room) + f" [shortened from {len(message.body)} characters]"
    return f"{head}: {body}"


def _receipt_text(receipt: Receipt) -> str:
    text = f"to {receipt.to}: {receipt.state}"
    if receipt.delivery is not None:
        text += f" ({receipt.delivery}"
        text += f", follow-up task {receipt.task_id})" if receipt.delivery == "revived" else ")"
    if receipt.failed:
        text += f" ({receipt.reason}: {receipt.detail})"
    return text


def _flat(receipt: Receipt) -> list[Receipt]:
    return list(receipt.recipients) if receipt.to == "*" else [receipt]


def _required_text(name: str, description: str, maximum: int, *, content: bool = False) -> Param:
    """A required string argument of 1 to ``maximum`` characters."""
    return Param(
        name=name,
        kind="string",
        required=True,
        description=description,
        min_length=1,
        max_length=maximum,
        form=f"1 to {maximum} characters",
        content=content,
    )


class MessageTools:
    """The handlers, bound to one manager and address."""

    def __init__(
        self, manager: SubagentManager, address: str, limits: ToolLimits, ceilings: dict[str, float]
    ) -> None:
        self.manager = manager
        self.address = address
        self.limits = limits
        self.ceilings = ceilings

    def _clamp(self, tool: str, requested: int) -> tuple[int, bool]:
        ceiling = ms(self.ceilings[tool])
        return (ceiling, True) if requested > ceiling else (requested, False)

    async def send(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        messenger = messenger_of(self.manager)
        to, body = str(args["to"]), str(args["message"])
        reply_to = args.get("reply_to")
        assert reply_to is None or isinstance(reply_to, str)
        wake = args.get("wake", True)
        assert isinstance(wake, bool)
        requested = args.get("await_reply_ms")
        if requested is None:
            receipt = messenger.send(self.address, to, body, reply_to=reply_to, wake=wake)
            reply = None
            details: dict[str, JSONValue] = {}
            reached = await self._committed(receipt)
            if reached is not None:
                details["room_recipients"] = reached
        else:
            assert isinstance(requested, int)
            wait_ms, clamped = self._clamp("send_message", requested)
            answer = await messenger.ask(
                self.address, to, body, timeout=wait_ms / 1000, reply_to=reply_to, wake=wake
            )
            receipt, reply = answer.receipt, answer.message
            details = {"reply_outcome": answer.outcome, "await_ms": wait_ms, "clamped": clamped}
            if reply is not None:
                details["reply"] = reply.to_dict()
        receipts = _flat(receipt)
        self._trace(span, receipt, reply_to)
        lines = [f"message {receipt.message_id} sent to {len(receipts)} recipient(s):"]
        if not receipts:
            lines = ["no live peer to broadcast to; nothing was sent."]
        if "room_recipients" in details:
            lines = [
                f"message {receipt.message_id} committed to the room for "
                f"{details['room_recipients']} recipient(s):"
            ]
        if details.get("room_recipients") == 0:  # a selector reaching nobody is no error
            lines = [
                f"message {receipt.message_id} is stored for the room's history and reached "
                "nobody (0 recipients):"
            ]
        lines += [f"- {_receipt_text(r)}" for r in receipts[:20]]
        if len(receipts) > 20:
            lines.append(f"(+{len(receipts) - 20} more in details)")
        if "reply_outcome" in details:
            if reply is not None:
                lines.append(_message_line(reply, self.limits.truncate_chars // 2))
            elif details["reply_outcome"] == "timeout":
                lines.append(
                    f"no reply within {details['await_ms']} ms; the peer may still answer: "
                    "call read_messages later rather than sending again."
                )
            else:
                lines.append(f"no reply will come: {details['reply_outcome']}.")
        details["message_id"] = receipt.message_id
        details["receipts"] = [_receipt_details(r) for r in receipts]
        failed = bool(receipts) and all(r.failed for r in receipts)
        return ToolResult(
            content=bound_text("\n".join(lines), self.limits.truncate_chars),
            details=details,
            is_error=failed and len(receipts) == 1 and details.get("room_recipients") != 0,
        )

    async def _committed(self, receipt: Receipt) -> int | None:
        """For a send through a bridged room's route: the members its commit reached,
        waited for within the tool's own ceiling (``None``: not a room send, not
        committed, or not yet at the ceiling: the receipt says which)."""
        messaging = messaging_of(self.manager)
        route = messaging.remotes.route(messaging.peers.of(self.address).root)
        if route is None or receipt.failed or receipt.to == "*":
            return None
        with anyio.move_on_after(self.ceilings["send_message"]):
            return await route.committed(receipt.message_id)
        return None

    async def send_input(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        task_id, text = str(args["task_id"]), str(args["message"])
        # Only this session's own subagents take its follow-up input (UnknownTask else).
        receipt = messenger_of(self.manager).send_input(task_id, text, session_id=self.address)
        span.set_attribute("subagents.message_id", receipt.message_id)
        span.set_attribute("subagents.task_id", task_id)
        return ToolResult(
            content=bound_text(
                f"input {receipt.message_id} for {task_id}: {_receipt_text(receipt)}",
                self.limits.truncate_chars,
            ),
            details={"message_id": receipt.message_id, "receipt": _receipt_details(receipt)},
            is_error=receipt.failed,
        )

    def _trace(self, span: ToolSpan, receipt: Receipt, reply_to: object) -> None:
        """The call's span names the message; a reply's links to the span of the agent
        whose message it answers (the question's sender, its recipient)."""
        span.set_attribute("subagents.message_id", receipt.message_id)
        if not isinstance(reply_to, str):
            return
        span.set_attribute("subagents.reply_to", reply_to)
        messenger = messenger_of(self.manager)
        asker = messenger.record(receipt.to)
        # A host's reply already linked the current span (this one) as it was sent.
        if asker is not None and messenger.record(self.address) is not None:
            span.link_tasks([handle_of(asker, self.manager)])

    async def read(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        messenger = messenger_of(self.manager)
        from_ = args.get("from")
        assert from_ is None or isinstance(from_, str)
        peek = args.get("peek", False)
        assert isinstance(peek, bool)
        requested = args.get("wait_ms")
        wait_ms, clamped = self._clamp("read_messages", int(requested or 0))  # type: ignore[call-overload]
        waiting = messenger.inbox(self.address, peek=True, from_=from_)
        room = self.limits.truncate_chars - _ROOM
        if not waiting and wait_ms > 0 and not peek:
            first = await messenger.recv(self.address, from_=from_, timeout=wait_ms / 1000)
            shown = [] if first is None else [first]
        else:
            # The oldest that fit whole (the first even if it does not: then shortened and
            # said so); the rest stay unread for the next call.
            count, used = 0, 0
            for message in waiting:
                used += len(_message_line(message, None)) + 1
                if count and used > room:
                    break
                count += 1
            shown = waiting[:count]
            if not peek and shown:
                shown = messenger.take_shown(self.address, shown)
        left = len(messenger.inbox(self.address, peek=True, from_=from_))
        if peek:  # what it showed still waits, but is not "more" beyond this answer
            left = max(left - len(shown), 0)
        lines = [_message_line(m, room if len(shown) == 1 else None) for m in shown]
        if not shown:
            lines = ["no messages" + (f" (waited {wait_ms} ms)" if wait_ms else "") + "."]
        if left:
            sender = "" if from_ is None else f" from {from_}"
            lines.append(f"{left} more message(s){sender} waiting: call read_messages again.")
        details: dict[str, JSONValue] = {
            "messages": [m.to_dict() for m in shown],
            "peeked": peek,
            "left": left,
        }
        if requested is not None:
            details["wait_ms"] = wait_ms
            details["clamped"] = clamped
        return ToolResult(content=bound_text("\n".join(lines), room + _ROOM), details=details)


def _receipt_details(receipt: Receipt) -> JSONValue:
    out = receipt.to_dict()
    out.pop("recipients", None)
    return out


def build_message_tools(
    manager: SubagentManager,
    address: str,
    limits: ToolLimits,
    ceilings: dict[str, float],
) -> list[Tool]:
    """``send_message`` and ``read_messages`` acting as ``address``; ``ceilings`` is the
    longest wait of each (seconds, below its host timeout)."""
    impl = MessageTools(manager, address, limits, ceilings)
    engine = limits.engine_timeouts
    messaging = messaging_of(manager)
    # A session bridged to a room (subagents.room.bridge) reaches other processes too.
    room = messaging.remotes.attached(messaging.peers.of(address).root)
    to_room = (
        " In the bridged room, also a member id (16 hex characters), 'room:*' (every "
        "member), 'file:<glob>' (members holding a lease on a matching file) or "
        "'tag:<tag>'; one that reaches 0 members fails (unknown)."
        if room
        else ""
    )
    send_max, read_max = ms(ceilings["send_message"]), ms(ceilings["read_messages"])

    def tool(
        name: str, *, title: str, description: str, params: list[Param], handler: Handler
    ) -> Tool:
        # What the three share: each writes (a receipt, a read mark), none is idempotent,
        # each has its own host timeout, and all answer within the same content limit.
        return make_tool(
            name=name,
            output_schema=output_schema(name),
            annotations=hints(
                read_only=False, destructive=False, idempotent=False, open_world=False
            ),
            engine_timeout=engine.get(name),
            content_limit=limits.truncate_chars,
            title=title,
            description=description,
            params=params,
            handler=handler,
        )

    return [
        tool(
            "send_message",
            title="Send message",
            description=(
                "Send a short message to another live agent (a task id or agent path from "
                "list_agents, your parent, a subagent) or to '*' (every live agent of your "
                "tree). Use it to share findings, ask a question, or give a running "
                "subagent follow-up instructions; it does not wait. Each recipient's "
                "receipt says queued, delivered, read, replied or failed (why: ended, "
                "full, closed). To get an answer in this call, set await_reply_ms (at "
                f"most {send_max} ms); otherwise read the reply later with read_messages. "
                "When answering a message, pass its id as reply_to." + to_room
            ),
            params=[
                _required_text(
                    "to",
                    "Recipient: a task id, an agent path (e.g. /root/coder), or "
                    "'*' for every live agent of your tree." + to_room,
                    _ADDRESS_MAX,
                ),
                _required_text(
                    "message",
                    "The text to send (self-contained: the recipient sees "
                    "nothing else of your conversation).",
                    MAX_MESSAGE_CHARS,
                    content=True,
                ),
                Param(
                    name="reply_to",
                    kind="string",
                    description="The id of the message this one answers.",
                    min_length=1,
                    max_length=64,
                    form="a message id: 1 to 64 characters",
                ),
                Param(
                    name="wake",
                    kind="boolean",
                    default=True,
                    description="false: do not wake an idle recipient nor revive an ended "
                    "one; the message waits until it next reads its messages.",
                ),
                Param(
                    name="await_reply_ms",
                    kind="integer",
                    minimum=0,
                    description=f"Wait up to this long for the reply (clamped to {send_max}); "
                    "not with '*'.",
                ),
            ],
            handler=impl.send,
        ),
        tool(
            "read_messages",
            title="Read messages",
            description=(
                "Read the messages other agents sent you, oldest first (each is handed out "
                "once; peek=true looks without taking). from limits it to one sender. "
                f"wait_ms waits for one to arrive (at most {read_max} ms), then answers "
                "with none: keep working rather than waiting in a loop."
            ),
            params=[
                Param(
                    name="from",
                    kind="string",
                    description="Only messages from this sender (task id or agent path"
                    + (", or a room member id)." if room else ")."),
                    min_length=1,
                    max_length=_ADDRESS_MAX,
                    form=f"1 to {_ADDRESS_MAX} characters",
                ),
                Param(
                    name="wait_ms",
                    kind="integer",
                    minimum=0,
                    description=f"Wait up to this long for a message when none is waiting "
                    f"(default 0, clamped to {read_max}).",
                ),
                Param(
                    name="peek",
                    kind="boolean",
                    default=False,
                    description="true: show the messages but leave them unread.",
                ),
            ],
            handler=impl.read,
        ),
        tool(
            "send_input",
            title="Send input",
            description=(
                "Give one of your own subagents (by task id) follow-up input: a running one "
                "reads it at its next step, a queued one once it starts. It never starts an "
                "ended one again: the receipt then fails with ended, and its result is in "
                "its envelope (wait_agent). It does not wait."
            ),
            params=[
                _required_text(
                    "task_id",
                    "The subagent's task id (from spawn_agent or list_agents).",
                    _ADDRESS_MAX,
                ),
                _required_text(
                    "message",
                    "The input (self-contained: the subagent sees nothing "
                    "else of your conversation).",
                    MAX_MESSAGE_CHARS,
                    content=True,
                ),
            ],
            handler=impl.send_input,
        ),
    ]
