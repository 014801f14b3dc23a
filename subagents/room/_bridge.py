"""``bridge``: a manager's host session as one member of a room, so that the peer-messaging
API (``manager.send/recv/inbox/ask``, ``RunContext.send``, the messaging tools) reaches
the members of other processes on the same store file (design/room.md, "The bridge").

Outbound, the session's route (``subagents._remote.RemoteRoute``) queues what its tree
sends to a member id or a room selector, and a task commits it with :meth:`Room.send`.
Inbound, a task waits in :meth:`Room.peek` (woken by commits of any process, marking
nothing), hands each message to the local inbox through the postbox, marks it
``accepted`` in the room, and ``read`` only once the local recipient took it: a process
killed before that leaves it unread, so the same member gets it again.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

import anyio

from .._errors import SubagentsError
from .._manager import messaging_of
from .._messages import Message, Receipt
from .._remote import MEMBER_ID
from ._records import Autonomy, SentMessage
from ._records import Message as RoomMessage

if TYPE_CHECKING:
    from .._manager import SubagentManager
    from .._messaging import Messaging
    from ._room import Room

__all__ = ["RoomLink", "bridge"]

logger = logging.getLogger("subagents.room")

PEEK_BATCH: Final = 50
"""Messages one look of the inbound loop hands on at most."""
REMEMBERED: Final = 1024
"""Room messages of this member whose local sender a reply still finds (the newest)."""
SEEN: Final = 4096
"""Room message ids the inbound loop remembers handing on, against a second hand-over."""
_FLUSH_SECONDS: Final = 5.0


class RoomLink:
    """A session bridged to a room, as :func:`bridge` yields it.

    Attributes:
        member_id: the session's member id in the room (what other members send to).
        room: the room joined (``room_name``).
        harness_key: the key it joined with: pass it again to be the same member after
            a restart (what was handed on and not read locally comes again).
    """

    def __init__(self, room: Room, member_id: str, room_name: str, harness_key: str) -> None:
        self._room = room
        self.member_id = member_id
        self.room = room_name
        self.harness_key = harness_key

    async def sent(self, *, limit: int = 20) -> tuple[SentMessage, ...]:
        """This member's newest messages in the room, with each recipient's state."""
        return await self._room.sent(self.member_id, limit=limit)

    def __repr__(self) -> str:
        return f"<RoomLink {self.member_id} room={self.room!r}>"


def _selector(address: str) -> str:
    """A local address the route accepts as the room's selector."""
    return address[5:] if address.startswith("room:") else address


class _Route:
    """The session's route to the room, and the bridge's three tasks."""

    def __init__(
        self, room: Room, member: str, messaging: Messaging, session_id: str, wake: bool
    ) -> None:
        self._room, self._member, self._session = room, member, session_id
        self._messaging, self._remotes = messaging, messaging.remotes
        self._wake = wake
        self._outgoing: deque[tuple[Message, Receipt]] = deque()
        self._sending = anyio.Event()
        # Room id -> (local id, local sender) of what this member sent; local id -> room id.
        self._sent: OrderedDict[int, tuple[str, str]] = OrderedDict()
        self._room_ids: dict[str, int] = {}
        # (local recipient, local id) -> what was handed on and not read yet.
        self._handed: dict[tuple[str, str], RoomMessage] = {}
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._reads: list[int] = []
        self._reading = anyio.Event()
        self._drained = anyio.Event()
        self.closed = False
        self.scope = anyio.CancelScope()

    # ------------------------------------------------------------------ RemoteRoute

    def accepts(self, address: str) -> bool:
        if MEMBER_ID.fullmatch(address):
            return True
        if address.startswith("room:"):
            rest = address[5:]
            return rest == "*" or MEMBER_ID.fullmatch(rest) is not None
        return address.startswith(("file:", "tag:")) and len(address.split(":", 1)[1]) > 0

    def send(self, message: Message, receipt: Receipt, wake: bool) -> None:
        if self.closed:
            self._remotes.fail(receipt, "closed", "the bridge to the room has stopped")
            return
        self._outgoing.append((message, receipt))
        self._sending.set()

    def changed(self, receipt: Receipt) -> None:
        handed = self._handed.pop((receipt.to, receipt.message_id), None)
        if handed is not None and receipt.state in ("read", "replied"):
            self._reads.append(handed.message_id)
            self._reading.set()
        elif handed is not None and receipt.failed and not self._again(handed, receipt):
            logger.info(
                "room message %d stays unread in the room: %s", handed.message_id, receipt.detail
            )
        self._drained.set()  # a full inbox may have room again

    def _again(self, handed: RoomMessage, receipt: Receipt) -> bool:
        """The child a message was handed to ended before reading it: the session gets it
        instead (the child's inbox is closed by now, so it is the target). Whether it
        took it."""
        if receipt.to == self._session or self.closed:
            return False
        return self._hand_on(handed, again=True)

    # ------------------------------------------------------------------ the tasks

    async def run(self) -> None:
        """The three tasks until the bridge exits or one of them stops."""
        with self.scope:
            async with anyio.create_task_group() as tg:
                for task in (self._outbound, self._inbound, self._marking):
                    tg.start_soon(self._guarded, task)

    async def _guarded(self, task: Callable[[], Awaitable[None]]) -> None:
        try:
            await task()
        except anyio.ClosedResourceError as exc:  # the room, or the session, closed
            logger.info("the bridge of session %r stops: %s", self._session, exc)
        except Exception:
            logger.exception("the bridge of session %r stopped", self._session)
        self.stop("the bridge to the room has stopped")
        self.scope.cancel()

    def stop(self, detail: str) -> None:
        """Take nothing more: what waits to go out fails ``closed``."""
        self.closed = True
        while self._outgoing:
            _, receipt = self._outgoing.popleft()
            self._remotes.fail(receipt, "closed", detail)

    async def _outbound(self) -> None:
        while True:
            while not self._outgoing:
                self._sending = anyio.Event()
                await self._sending.wait()
            message, receipt = self._outgoing.popleft()
            await self._carry(message, receipt)

    async def _carry(self, message: Message, receipt: Receipt) -> None:
        answers = self._room_id(message.reply_to)
        try:
            sent = await self._room.send(
                self._member, _selector(message.to), message.body, reply_to=answers
            )
        except anyio.ClosedResourceError:
            self._remotes.fail(receipt, "closed", "the room was closed before it was sent")
            raise
        except SubagentsError as exc:  # an unknown member id, a bad selector, the store
            self._remotes.fail(receipt, "unknown", str(exc))
            return
        self._sent[sent.message_id] = (message.id, message.from_)
        self._room_ids[message.id] = sent.message_id
        if len(self._sent) > REMEMBERED:
            _, (local, _) = self._sent.popitem(last=False)
            self._room_ids.pop(local, None)
        if not sent.recipients:
            self._remotes.fail(
                receipt,
                "unknown",
                f"room message {sent.message_id} is stored (the room's history) but reached "
                f"0 members: {sent.warning}",
            )

    def _room_id(self, local: str | None) -> int | None:
        """The room id of the message a local ``reply_to`` names, if it is one."""
        if local is None:
            return None
        found = self._room_ids.get(local)
        if found is None and local.startswith("r") and local[1:].isdigit():
            return int(local[1:])
        return found

    def _target(self, message_reply: int | None) -> tuple[str, str | None]:
        """Where a room message goes (the local sender of what it answers while that runs,
        else the session) and its local ``reply_to``."""
        if message_reply is None:
            return self._session, None
        asked = self._sent.get(message_reply)
        if asked is None:
            return self._session, f"r{message_reply}"
        local, sender = asked
        live = sender != self._session and self._messaging.postbox.is_open(sender)
        return (sender if live else self._session), local

    async def _inbound(self) -> None:
        after: int | None = None
        while True:
            if self._drained.is_set():
                self._drained = anyio.Event()
            found = await self._room.peek(self._member, after=after, limit=PEEK_BATCH, timeout=None)
            handed: list[int] = []
            held = False
            for message in found:
                if message.message_id not in self._seen:
                    held = not self._hand_on(message)
                    if held:
                        break
                    handed.append(message.message_id)
                after = message.message_id
            if handed:
                await self._room.accept(self._member, handed)
            if held:
                await self._drained.wait()  # a receipt of that inbox moved: try again

    def _hand_on(self, message: RoomMessage, *, again: bool = False) -> bool:
        """Put a room message into its local inbox; ``False`` when that is full (it stays
        in the room, tried again once the inbox moves; ``again``: handed on before, to a
        child that ended, and refused now). Raises ``ClosedResourceError`` when the
        session is closed (not ``again``)."""
        to, reply_to = self._target(message.reply_to)
        local = f"r{message.message_id}"
        receipt = self._messaging.arrive(
            to, local, message.sender, message.body, reply_to, self._wake
        )
        if again and receipt.failed:
            return False
        if receipt.reason == "full":
            self._drained = anyio.Event()
            self._remotes.hold(to, self)
            return False
        if receipt.failed:
            raise anyio.ClosedResourceError(
                f"session {self._session!r} takes no messages: {receipt.detail}"
            )
        self._handed[to, local] = message
        self._remotes.brought(receipt, self)
        self._seen[message.message_id] = None
        if len(self._seen) > SEEN:
            self._seen.popitem(last=False)
        return True

    async def _marking(self) -> None:
        while True:
            while not self._reads:
                self._reading = anyio.Event()
                await self._reading.wait()
            await self.flush()

    async def flush(self) -> None:
        """Mark read in the room what the local recipients have read."""
        while self._reads:
            ids, self._reads = self._reads[:1000], self._reads[1000:]
            await self._room.mark_read(self._member, ids)


@asynccontextmanager
async def bridge(
    room: Room,
    manager: SubagentManager,
    session_id: str = "root",
    *,
    room_name: str = "default",
    extra_rooms: Sequence[str] = (),
    label: str | None = None,
    tags: Sequence[str] | None = None,
    harness_key: str | None = None,
    autonomy: Autonomy | None = None,
) -> AsyncIterator[RoomLink]:
    """Bridge host session ``session_id`` of ``manager`` to ``room``, as one member.

    ``async with bridge(room, manager) as link:`` joins ``room_name`` (and
    ``extra_rooms``) with ``harness_key`` (given: the same member as the last time it
    joined with it; else a new UUID, kept in :attr:`RoomLink.harness_key`), then, until
    it exits, a send of the session's tree to a member id, ``room:*``,
    ``room:<member id>``, ``file:<glob>`` or ``tag:<tag>`` goes to the room (its receipt
    ``queued`` at once, failed ``unknown`` if it reaches 0 members or the room refuses
    it), and the room's messages for the member arrive in the session's inbox (a reply
    in the inbox of the child that sent what it answers, while that runs) with ``from_``
    the sender's member id and id ``r<room message id>``. Exiting detaches the route (a
    member id is an unknown address again) and stops the bridge's tasks; it closes
    neither the room nor the manager, both of which must be open throughout.

    Raises:
        SpawnRejected: the session is closed.
        RuntimeError: the session is bridged already.
    """
    key = harness_key if harness_key is not None else str(uuid.uuid4())
    joined = await room.join(
        room_name,
        extra_rooms=extra_rooms,
        label=label if label is not None else f"subagents:{session_id}",
        tags=tags,
        autonomy=autonomy,
        harness_key=key,
    )
    messaging = messaging_of(manager)
    route = _Route(room, joined.member_id, messaging, session_id, joined.autonomy == "wake")
    messaging.attach_remote(session_id, route)
    raised: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(route.run)
            try:
                yield RoomLink(room, joined.member_id, room_name, key)
            except BaseException as exc:
                # Raised again once the tasks stopped: the caller's error stays its own,
                # not wrapped in this task group's exception group.
                raised = exc
            finally:
                route.stop("the bridge to the room ended before it was sent")
                with anyio.CancelScope(shield=True), anyio.move_on_after(_FLUSH_SECONDS):
                    try:
                        await route.flush()  # what was read locally is read in the room
                    except (anyio.ClosedResourceError, SubagentsError):
                        logger.info(
                            "the bridge of session %r could not mark its last reads", session_id
                        )
                route.scope.cancel()
    finally:
        messaging.detach_remote(session_id)
    if raised is not None:
        raise raised
