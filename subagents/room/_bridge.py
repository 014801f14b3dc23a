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
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

import anyio

from .._errors import ConfigError, SubagentsError
from .._manager import messaging_of
from .._messages import Receipt
from ._records import Autonomy, SentMessage
from ._route import PEEK_BATCH, REMEMBERED, SEEN, Route

if TYPE_CHECKING:
    from .._manager import SubagentManager
    from ._room import Room

__all__ = ["PEEK_BATCH", "REMEMBERED", "SEEN", "RoomLink", "bridge"]

logger = logging.getLogger("subagents.room")

FLUSH_SECONDS: Final = 5.0
"""The most an exit waits for the commit in flight, the last read marks and the leave;
past it only the one room transaction running then is waited for (at most twice the
room's ``busy_timeout``: SQLite's wait, then the retries after it)."""


class RoomLink:
    """A session bridged to a room, as :func:`bridge` yields it.

    Attributes:
        member_id: the session's member id in the room (what other members send to).
        room: the room joined (``room_name``).
        harness_key: the key it joined with: pass it again to be the same member after
            a restart (what was handed on and not read locally comes again).
    """

    def __init__(self, route: Route, room: Room, room_name: str, harness_key: str) -> None:
        self._room, self._route = room, route
        self.member_id = route.member
        self.room = room_name
        self.harness_key = harness_key

    async def sent(self, *, limit: int = 20) -> tuple[SentMessage, ...]:
        """This member's newest messages in the room, with each recipient's state."""
        return await self._room.sent(self.member_id, limit=limit)

    async def committed(self, receipt: Receipt) -> int | None:
        """Wait until the room commit of the message of ``receipt`` (a send through this
        bridge, whose receipt is ``queued`` at once) ended: how many members it reached
        (0: stored for the room's history only, the receipt failed ``unknown``), or
        ``None`` when it was not committed (the receipt failed: the room refused it, or
        the bridge stopped first) or is not one of this bridge's newest 1,024 sends."""
        return await self._route.committed(receipt.message_id)

    def __repr__(self) -> str:
        return f"<RoomLink {self.member_id} room={self.room!r}>"


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
    the sender's member id and id ``r<room message id>`` (and the room's ``subject``).
    Exiting lets the commit in flight end, marks read in the room what was read here,
    leaves the room when no ``harness_key`` was given (nobody can be that member again),
    detaches the route (a member id is an unknown address again) and stops the bridge's
    tasks, within :data:`FLUSH_SECONDS` plus the one room transaction then running; it
    closes neither the room nor the manager, both of which must be open throughout.

    Raises:
        ConfigError: ``session_id`` is not a non-empty string (before anything joins).
        SpawnRejected: the session is closed (nothing joins).
        RuntimeError: the session is bridged already (nothing joins).
    """
    if not isinstance(session_id, str) or not session_id.strip():
        raise ConfigError("session_id", "a host session's id (a non-empty string)", session_id)
    key = harness_key if harness_key is not None else str(uuid.uuid4())
    messaging = messaging_of(manager)
    route = Route(room, messaging, session_id)
    # Attached before it joins: a refused bridge (bridged already, a closed session)
    # leaves no member behind; what is sent meanwhile waits for the outbound task.
    messaging.attach_remote(session_id, route)
    try:
        joined = await room.join(
            room_name,
            extra_rooms=extra_rooms,
            label=label if label is not None else f"subagents:{session_id}",
            tags=tags,
            autonomy=autonomy,
            harness_key=key,
        )
    except BaseException:
        route.stop("the bridge to the room could not join it")
        messaging.detach_remote(session_id, route)
        raise
    route.member, route.wake = joined.member_id, joined.autonomy == "wake"
    raised: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(route.run)
            try:
                yield RoomLink(route, room, room_name, key)
            except BaseException as exc:
                # Raised again once the tasks stopped: the caller's error stays its own,
                # not wrapped in this task group's exception group.
                raised = exc
            finally:
                route.stop("the bridge to the room ended before it was sent")
                with anyio.CancelScope(shield=True), anyio.move_on_after(FLUSH_SECONDS):
                    try:
                        # Without a harness key nobody can be this member again: it
                        # leaves, so selectors stop counting it.
                        await route.finish(leave=harness_key is None)
                    except (anyio.ClosedResourceError, SubagentsError):
                        logger.info(
                            "the bridge of session %r could not mark its last reads", session_id
                        )
                route.scope.cancel()
    finally:
        messaging.detach_remote(session_id, route)
    if raised is not None:
        raise raised
