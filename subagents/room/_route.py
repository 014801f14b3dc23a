"""A bridged session's route to the room (``subagents._remote.RemoteRoute``), and the
bridge's three tasks: outbound (commits what the session's tree sends), inbound (hands
the room's messages to local inboxes) and marking (reads done locally, read in the room).
See design/room.md, "The bridge"."""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Final, Literal, TypeVar

import anyio
import anyio.lowlevel

from .._errors import SubagentsError
from .._messages import Message, Receipt
from .._remote import MEMBER_ID
from .._retry import retry_while
from ..store._errors import StoreError
from ._ids import HARNESS_KEY
from ._records import Message as RoomMessage
from ._records import Sent

if TYPE_CHECKING:
    from .._messaging import Messaging
    from ._room import Room

__all__ = ["PEEK_BATCH", "REMEMBERED", "SEEN", "Route"]

logger = logging.getLogger("subagents.room")

PEEK_BATCH: Final = 50
"""Messages one look of the inbound loop hands on at most."""
REMEMBERED: Final = 1024
"""Room messages of this member whose local sender a reply still finds (the newest), and
sends whose commit :meth:`Route.committed` still answers for."""
SEEN: Final = 4096
"""Room message ids the inbound loop remembers handing on, against a second hand-over."""

T = TypeVar("T")
HandOver = Literal["handed", "full", "refused"]


def _selector(address: str) -> str:
    """A local address the route accepts as the room's selector."""
    return address[5:] if address.startswith("room:") else address


def _locked(exc: BaseException) -> bool:
    """A store lock another connection holds past the busy timeout: it passes."""
    return isinstance(exc, StoreError) and exc.reason == "locked"


async def _patiently(call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, retried with backoff while the store is locked (not a reason to stop)."""
    return await retry_while(call, retry_if=_locked, first_wait=0.01, max_wait=1.0)


class Route:
    """The session's route to the room, and the bridge's three tasks."""

    def __init__(self, room: Room, messaging: Messaging, session_id: str) -> None:
        self._room, self._session = room, session_id
        self.member = ""  # set once joined; until then nothing is its own address
        self.wake = True
        self._messaging, self._remotes = messaging, messaging.remotes
        self._outgoing: deque[tuple[Message, Receipt]] = deque()
        self._sending = anyio.Event()
        self._carrying: anyio.Event | None = None  # set once the commit in flight ended
        # Local id -> the end of its commit, while pending; then the members it reached
        # (None: not committed), the newest REMEMBERED.
        self._pending: dict[str, anyio.Event] = {}
        self._reached: OrderedDict[str, int | None] = OrderedDict()
        # Room id -> (local id, local sender) of what this member sent; local id -> room id.
        self._sent: OrderedDict[int, tuple[str, str]] = OrderedDict()
        self._room_ids: dict[str, int] = {}
        # (local recipient, local id) -> what was handed on and not read yet.
        self._handed: dict[tuple[str, str], RoomMessage] = {}
        # Left by a child that ended unread, for the session, whose inbox was full.
        self._again: deque[RoomMessage] = deque()
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._reads: list[int] = []
        # Set while no hand-over waits for its accept: a read marked before its accept
        # commits would find it untaken and, past its TTL, not move.
        self._accepted = anyio.Event()
        self._accepted.set()
        self._reading = anyio.Event()
        self._drained = anyio.Event()
        self.closed = False
        self.scope = anyio.CancelScope()

    # ------------------------------------------------------------------ RemoteRoute

    def accepts(self, address: str) -> bool:
        # A bare short hex is no room address: local task ids are 12 hex, and one the
        # tree forgot stays a local unknown peer. A truncated id or a label goes as
        # ``room:<prefix>``; a harness key fails naming its member (the room's rules).
        if address.startswith("room:"):
            return len(address) > 5
        if MEMBER_ID.fullmatch(address) or HARNESS_KEY.fullmatch(address):
            return True
        return address.startswith(("file:", "tag:")) and len(address.split(":", 1)[1]) > 0

    def is_self(self, address: str) -> bool:
        return bool(self.member) and _selector(address) == self.member

    @property
    def live(self) -> bool:
        return not self.closed

    def send(self, message: Message, receipt: Receipt, wake: bool) -> None:
        if self.closed:
            self._remotes.fail(receipt, "closed", "the bridge to the room has stopped")
            return
        self._pending[message.id] = anyio.Event()
        self._outgoing.append((message, receipt))
        self._sending.set()

    def changed(self, receipt: Receipt) -> None:
        handed = self._handed.pop((receipt.to, receipt.message_id), None)
        if handed is not None and receipt.state in ("read", "replied"):
            self._reads.append(handed.message_id)
            self._reading.set()
        elif handed is not None and receipt.failed:
            if receipt.to == self._session or self.closed:
                logger.info(
                    "room message %d stays unread in the room: %s",
                    handed.message_id,
                    receipt.detail,
                )
            else:
                # The child it was handed to ended before reading it: the session gets
                # it instead, once its inbox has room.
                self._again.append(handed)
        self._hand_again()
        self._drained.set()  # a full inbox may have room again

    def _hand_again(self) -> None:
        """Hand what ended children left to the session, oldest first, while it takes."""
        while self._again and not self.closed:
            taken = self._hand_on(self._again[0], again=True)
            if taken == "full":
                return  # held: the session inbox's next receipt change tries again
            if taken == "refused":
                logger.info("room message %d stays unread in the room", self._again[0].message_id)
            self._again.popleft()

    async def committed(self, message_id: str) -> int | None:
        """Once the commit of ``message_id`` (sent through this route) ended: the members
        it reached in the room, or ``None`` (not committed: its receipt failed, or not a
        message of this route's newest :data:`REMEMBERED`)."""
        pending = self._pending.get(message_id)
        if pending is not None:
            await pending.wait()
        else:
            await anyio.lowlevel.checkpoint()
        return self._reached.get(message_id)

    def _settle(self, message_id: str, reached: int | None) -> None:
        self._reached[message_id] = reached
        if len(self._reached) > REMEMBERED:
            self._reached.popitem(last=False)
        pending = self._pending.pop(message_id, None)
        if pending is not None:
            pending.set()

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
        """Take nothing more: what waits to go out fails ``closed``; a host waiting for
        activity looks again (nothing can come from the room now)."""
        was_closed, self.closed = self.closed, True
        while self._outgoing:
            message, receipt = self._outgoing.popleft()
            self._remotes.fail(receipt, "closed", detail)
            self._settle(message.id, None)
        if not was_closed:
            self._messaging.remote_stopped(self._session)

    async def _outbound(self) -> None:
        while True:
            while not self._outgoing:
                self._sending = anyio.Event()
                await self._sending.wait()
            message, receipt = self._outgoing.popleft()
            done = self._carrying = anyio.Event()
            try:
                await self._carry(message, receipt)
            finally:
                self._carrying = None
                done.set()
                if message.id in self._pending:  # cancelled before it was committed
                    self._remotes.fail(receipt, "closed", "the bridge ended before it was sent")
                    self._settle(message.id, None)

    async def _carry(self, message: Message, receipt: Receipt) -> None:
        answers = self._room_id(message.reply_to)

        async def commit() -> Sent:
            # Once started, a commit runs to its end even as the bridge exits, so its
            # receipt says what happened (committed: left as is), never queued for good.
            with anyio.CancelScope(shield=True):
                sent = await self._room.send(
                    self.member, _selector(message.to), message.body, reply_to=answers
                )
            return sent

        try:
            sent = await _patiently(commit)
        except anyio.ClosedResourceError:
            self._remotes.fail(receipt, "closed", "the room was closed before it was sent")
            self._settle(message.id, None)
            raise
        except StoreError as exc:  # not "locked" (that is retried): the bridge stops
            self._remotes.fail(receipt, "closed", f"the bridge to the room has stopped: {exc}")
            self._settle(message.id, None)
            raise
        except SubagentsError as exc:  # an unknown member id, a bad selector
            self._remotes.fail(receipt, "unknown", str(exc))
            self._settle(message.id, None)
            return
        # Recorded before anything else runs: the inbound loop waits for a commit in
        # flight before it routes a reply it cannot place, so no reply outruns this.
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
        self._settle(message.id, len(sent.recipients))

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
            found = await _patiently(partial(self._peek, after))
            handed: list[int] = []
            held = False
            try:
                for message in found:
                    if message.message_id not in self._seen:
                        carrying = self._carrying
                        if message.reply_to not in self._sent and carrying is not None:
                            await carrying.wait()  # it may answer the message in flight
                        held = self._hand_on(message) == "full"
                        if held:
                            break
                        handed.append(message.message_id)
                    after = message.message_id
                if handed:
                    await _patiently(partial(self._room.accept, self.member, handed))
            finally:
                # Also when cancelled before the accept: exit never waits for it.
                self._accepted.set()
            if held:
                await self._drained.wait()  # a receipt of that inbox moved: try again

    async def _peek(self, after: int | None) -> tuple[RoomMessage, ...]:
        return await self._room.peek(self.member, after=after, limit=PEEK_BATCH, timeout=None)

    def _hand_on(self, message: RoomMessage, *, again: bool = False) -> HandOver:
        """Put a room message into its local inbox: ``full`` when that is full (it stays
        in the room, or with ``again`` in this route, tried again once the inbox moves;
        ``again``: handed on before, to a child that ended); ``refused`` (``again`` only)
        when the session takes no more. Raises ``ClosedResourceError`` when the session
        is closed (not ``again``)."""
        to, reply_to = self._target(message.reply_to)
        local = f"r{message.message_id}"
        receipt = self._messaging.arrive(
            to, local, message.sender, message.body, reply_to, self.wake, message.subject
        )
        if receipt.reason == "full":
            self._drained = anyio.Event()
            self._remotes.hold(to, self)
            return "full"
        if receipt.failed and again:
            return "refused"
        if receipt.failed:
            raise anyio.ClosedResourceError(
                f"session {self._session!r} takes no messages: {receipt.detail}"
            )
        self._handed[to, local] = message
        self._remotes.brought(receipt, self)
        if not again and self._accepted.is_set():
            self._accepted = anyio.Event()
        self._seen[message.message_id] = None
        if len(self._seen) > SEEN:
            self._seen.popitem(last=False)
        return "handed"

    async def _marking(self) -> None:
        while True:
            while not self._reads:
                self._reading = anyio.Event()
                await self._reading.wait()
            await self.flush()

    async def flush(self) -> None:
        """Mark read in the room what the local recipients have read."""
        while self._reads:
            await self._accepted.wait()
            ids, self._reads = self._reads[:1000], self._reads[1000:]
            await _patiently(partial(self._room.mark_read, self.member, ids))

    async def finish(self, leave: bool) -> None:
        """At exit: the commit in flight ends, what was read locally is marked read in
        the room, and with ``leave`` the member leaves its rooms."""
        carrying = self._carrying
        if carrying is not None:
            await carrying.wait()
        await self.flush()
        if leave:
            await _patiently(partial(self._room.leave, self.member))
