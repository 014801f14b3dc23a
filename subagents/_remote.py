"""The seam to other processes: a session's route out, and messages brought in.

A :class:`RemoteRoute` carries a session's messages (its own and its children's) to
addresses its tree does not know, and brings messages from outside into local inboxes
through the same postbox, so FIFO, capacity, receipts, wake-ups and the tools work as for
a local message. ``subagents.room.bridge`` is one; the core never imports it
(design/messaging.md, "The seam for durability").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from ._errors import UnknownPeer
from ._messages import FailureReason, Message, Receipt
from ._messages import fail as fail_receipt

if TYPE_CHECKING:
    from ._router import Postbox

__all__ = ["MEMBER_ID", "RemoteRoute", "Remotes"]

MEMBER_ID: Final = re.compile(r"[0-9a-f]{16}")
"""The shape of a room member's id (design/room.md): 16 lower-case hex characters."""
_SHORT_HEX: Final = re.compile(r"[0-9a-f]{4,15}")
"""A bare hex address a route does not take (a local task id is 12), though it may be a
truncated member id."""


class RemoteRoute(Protocol):
    """A session's way to members of other processes. Every method but
    :meth:`committed` is synchronous and never blocks."""

    def accepts(self, address: str) -> bool:
        """Whether ``address`` (unknown to the sender's tree) is one this route carries."""
        ...

    def is_self(self, address: str) -> bool:
        """Whether ``address`` (one it accepts) names the session itself over there: a
        send to it is a send to oneself."""
        ...

    @property
    def live(self) -> bool:
        """Whether it still brings messages in (``False`` once it stopped, though still
        attached: what is sent through it fails ``closed``)."""
        ...

    def send(self, message: Message, receipt: Receipt, wake: bool) -> None:
        """Carry ``message`` (``message.to`` an address it accepts): only enqueue it; a
        failure later fails ``receipt`` through :meth:`Remotes.fail`."""
        ...

    async def committed(self, message_id: str) -> int | None:
        """Once the commit of ``message_id`` (sent through it) ended: how many members
        it reached, or ``None`` (not committed, or not a message it carries)."""
        ...

    def changed(self, receipt: Receipt) -> None:
        """A receipt moved: one of a message this route brought in (``read``: its local
        recipient took it), or any receipt of an address it asked :meth:`Remotes.hold`
        about (that inbox may have room again)."""
        ...


class Remotes:
    """The routes of one manager's host sessions, and what they brought in.

    Args:
        on_change: the messaging's receipt hook (the ``subagent.message`` events).
    """

    def __init__(self, on_change: Callable[[Receipt], None]) -> None:
        self._on_change = on_change
        self._routes: dict[str, RemoteRoute] = {}
        # (local recipient, local message id) -> the route that brought it in, until read.
        self._inbound: dict[tuple[str, str], RemoteRoute] = {}
        self._held: dict[str, RemoteRoute] = {}  # full inboxes a route waits on
        # Each pending ask of a remote address, by asked message id: the asking session,
        # the asker and the member asked (an ``ask`` needs an inbox to wait on, one per
        # member, shared by the sessions asking it).
        self.asks: dict[str, tuple[str, str, str]] = {}

    @property
    def active(self) -> bool:
        """Whether any session has a route."""
        return bool(self._routes)

    def attached(self, session_id: str) -> bool:
        """Whether ``session_id`` has a live route (messages may come from outside)."""
        route = self._routes.get(session_id) if self._routes else None
        return route is not None and route.live

    def route(self, session_id: str) -> RemoteRoute | None:
        """``session_id``'s route, live or stopped."""
        return self._routes.get(session_id) if self._routes else None

    def attach(self, session_id: str, route: RemoteRoute) -> None:
        """``session_id``'s messages to addresses ``route`` accepts go to it."""
        if session_id in self._routes:
            raise RuntimeError(f"session {session_id!r} has a remote route attached already")
        self._routes[session_id] = route

    def detach(
        self,
        session_id: str,
        route: RemoteRoute,
        postbox: Postbox,
        awaited: dict[str, tuple[float, str]],
    ) -> None:
        """``session_id`` has no route any more (nothing if ``route`` is not its route):
        each pending ask of its tree ends (``awaited``, the messaging's asked ids -> the
        deadline and the run waited on, moves it to a run that is not there, so it says
        ``closed``), and the inbox an ask waits on closes once no ask of another session
        waits on that member."""
        if self._routes.get(session_id) is not route:
            return
        del self._routes[session_id]
        self._inbound = {k: r for k, r in self._inbound.items() if r is not route}
        self._held = {k: r for k, r in self._held.items() if r is not route}
        self.end_asks(session_id, postbox, awaited)

    def end_asks(
        self, session_id: str, postbox: Postbox, awaited: dict[str, tuple[float, str]]
    ) -> None:
        """Each pending ask of ``session_id``'s tree ends ``closed`` (its route stopped
        or went: no reply can come in), as :meth:`detach` says."""
        mine = [(k, v) for k, v in self.asks.items() if v[0] == session_id]
        gone = f"{session_id} (its route, closed)"
        for message_id, (_, asker, _) in mine:
            del self.asks[message_id]
            deadline, _ = awaited.get(message_id, (0.0, gone))
            awaited[message_id] = (deadline, gone)
            postbox.redirect(asker, message_id, gone)
        others = {member for _, _, member in self.asks.values()}
        for member in {member for _, (_, _, member) in mine} - others:
            postbox.close(member, "closed", f"the route to {member} was closed", None)

    def accepting(self, root: str, address: str) -> RemoteRoute | None:
        """The route of session ``root`` if it carries ``address``."""
        route = self._routes.get(root) if self._routes else None
        return route if route is not None and route.accepts(address) else None

    @staticmethod
    def local_typo(exc: UnknownPeer) -> bool:
        """Whether an unknown address a route would take is likelier a local one mistyped
        (it names local suggestions, and is neither a whole member id nor a selector)."""
        address = exc.address
        return bool(exc.suggestions) and ":" not in address and not MEMBER_ID.fullmatch(address)

    def unknown(self, exc: UnknownPeer, root: str | None = None) -> UnknownPeer:
        """``exc``, or with a hint when its address looks like a room member's id (when
        session ``root`` has a route: also a short hex, which it does not take)."""
        if (
            root is not None
            and self.route(root) is not None
            and _SHORT_HEX.fullmatch(exc.address)
            and not exc.suggestions
        ):
            return UnknownPeer(
                exc.address,
                exc.suggestions,
                "a room member is addressed by its 16-hex id or room:<id> (a truncated "
                "id or label too)",
            )
        if not MEMBER_ID.fullmatch(exc.address):
            return exc
        return UnknownPeer(
            exc.address,
            exc.suggestions,
            "it looks like a room member's id, and no room is bridged for this session "
            "(subagents.room.bridge)",
        )

    def brought(self, receipt: Receipt, route: RemoteRoute) -> None:
        """``route`` brought in the message of ``receipt``: tell it when it moves."""
        if not receipt.failed:
            self._inbound[receipt.to, receipt.message_id] = route

    def hold(self, address: str, route: RemoteRoute) -> None:
        """``address``'s inbox was full: tell ``route`` of its next receipt change."""
        self._held[address] = route

    def changed(self, receipt: Receipt) -> None:
        """A receipt moved (every one, while a route is attached)."""
        key = (receipt.to, receipt.message_id)
        route = self._inbound.get(key)
        if route is not None and receipt.state != "delivered":
            del self._inbound[key]  # read, replied or failed: it moves no more for the route
            route.changed(receipt)
        held = self._held.pop(receipt.to, None) if self._held else None
        if held is not None and held is not route:
            held.changed(receipt)

    def fail(self, receipt: Receipt, reason: FailureReason, detail: str) -> None:
        """A route could not carry the message of ``receipt``: it fails, with an event."""
        if fail_receipt(receipt, reason, detail):
            self._on_change(receipt)
