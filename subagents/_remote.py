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
from typing import Final, Protocol

from ._errors import UnknownPeer
from ._messages import FailureReason, Message, Receipt
from ._messages import fail as fail_receipt

__all__ = ["MEMBER_ID", "RemoteRoute", "Remotes"]

MEMBER_ID: Final = re.compile(r"[0-9a-f]{16}")
"""The shape of a room member's id (design/room.md): 16 lower-case hex characters."""


class RemoteRoute(Protocol):
    """A session's way to members of other processes. Every method is synchronous and
    never blocks."""

    def accepts(self, address: str) -> bool:
        """Whether ``address`` (unknown to the sender's tree) is one this route carries."""
        ...

    def send(self, message: Message, receipt: Receipt, wake: bool) -> None:
        """Carry ``message`` (``message.to`` an address it accepts): only enqueue it; a
        failure later fails ``receipt`` through :meth:`Remotes.fail`."""
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
        # Remote addresses asked by each session: an ``ask`` needs an inbox to wait on.
        self.asked: dict[str, set[str]] = {}

    @property
    def active(self) -> bool:
        """Whether any session has a route."""
        return bool(self._routes)

    def attached(self, session_id: str) -> bool:
        """Whether ``session_id`` has a route (messages may come from outside)."""
        return session_id in self._routes if self._routes else False

    def attach(self, session_id: str, route: RemoteRoute) -> None:
        """``session_id``'s messages to addresses ``route`` accepts go to it."""
        if session_id in self._routes:
            raise RuntimeError(f"session {session_id!r} has a remote route attached already")
        self._routes[session_id] = route

    def detach(self, session_id: str) -> set[str]:
        """``session_id`` has no route any more; the remote addresses it asked."""
        route = self._routes.pop(session_id, None)
        if route is not None:
            self._inbound = {k: r for k, r in self._inbound.items() if r is not route}
            self._held = {k: r for k, r in self._held.items() if r is not route}
        return self.asked.pop(session_id, set())

    def accepting(self, root: str, address: str) -> RemoteRoute | None:
        """The route of session ``root`` if it carries ``address``."""
        route = self._routes.get(root) if self._routes else None
        return route if route is not None and route.accepts(address) else None

    @staticmethod
    def unknown(exc: UnknownPeer) -> UnknownPeer:
        """``exc``, or with a hint when its address looks like a room member's id."""
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
