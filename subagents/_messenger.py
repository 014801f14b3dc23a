"""The messaging part the manager holds: what one address (a host session, or a running
child's task id) does with messages.

:class:`Messenger` is built from the parts it needs (the manager's :class:`Messaging`, its
sessions, the slot lending and the ``completions`` factory). The manager's ``send``,
``recv``, ``inbox``, ``peers``, ``ask``, ``send_input`` and ``activity`` delegate to it for
a host session; :class:`~subagents._context.RunContext` and the messaging tools call it for
their own address. See design/messaging.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import anyio

from . import _message_waits
from ._envelope import DelegateResult
from ._errors import SpawnRejected
from ._messages import Activity, Message, PeerInfo, Receipt, Reply
from ._validators import seconds

if TYPE_CHECKING:
    from ._completions import Completions
    from ._messaging import Messaging
    from ._record import ChildRecord
    from ._sessions import Sessions

__all__ = ["Messenger"]

Lend = Callable[[], AbstractAsyncContextManager[None]]


class _HostInbox:
    """A host session's inbox as :meth:`Completions.activity` watches it."""

    __slots__ = ("_messaging", "_session")

    def __init__(self, messaging: Messaging, session_id: str) -> None:
        self._messaging = messaging
        self._session = session_id

    def peek(self) -> list[Message]:
        return self._messaging.postbox.peek(self._session, None)

    def waking(self) -> bool:
        return self._messaging.postbox.waking(self._session)

    def watch(self) -> anyio.Event:
        return self._messaging.postbox.watch(self._session, idle=True)

    def unwatch(self, event: anyio.Event) -> None:
        self._messaging.postbox.unwatch(self._session, event)

    def remote(self) -> bool:
        return self._messaging.remotes.attached(self._session)


class Messenger:
    """Send, receive and list peers for an address; the waits lend the caller's slot.

    Args:
        messaging: the manager's messaging (postbox, peers, what a send does).
        sessions: the records (to find a child by task id).
        lend: lends the calling child's slot around a wait.
        completions: ``completions(session_id)``, what :meth:`activity` also waits on.
    """

    def __init__(
        self,
        messaging: Messaging,
        sessions: Sessions,
        lend: Lend,
        completions: Callable[[str], Completions],
    ) -> None:
        self._messaging = messaging
        self._sessions = sessions
        self._lend = lend
        self._completions = completions

    def send(
        self, sender: str, to: str, body: str, *, reply_to: str | None = None, wake: bool = True
    ) -> Receipt:
        """See :meth:`SubagentManager.send`."""
        return self._messaging.send(sender, to, body, reply_to=reply_to, wake=wake)

    async def recv(
        self, address: str, *, from_: str | None = None, timeout: float | None = None
    ) -> Message | None:
        """See :meth:`SubagentManager.recv`."""
        return await _message_waits.recv(self._messaging, address, from_, timeout, self._lend)

    def inbox(
        self,
        address: str,
        *,
        peek: bool = False,
        from_: object = None,
        limit: int | None = None,
        ids: object = None,
    ) -> list[Message]:
        """See :meth:`SubagentManager.inbox` (``limit``: the oldest ``limit`` only)."""
        if ids is not None:
            self._messaging.own(address)
            return self.take_shown(address, _message_waits.message_ids(ids), peek=peek)
        return _message_waits.take(self._messaging, address, peek=peek, from_=from_, limit=limit)

    def take_shown(
        self, address: str, shown: Sequence[Message | str], *, peek: bool = False
    ) -> list[Message]:
        """Take the messages of ``shown`` (or with these ids) still waiting for ``address``
        (receipts ``read``): what a loop showed its model, once the call that showed them
        has returned. With ``peek``, only those still waiting, left in place."""
        postbox, taken = self._messaging.postbox, []
        wanted = {m if isinstance(m, str) else m.id for m in shown}
        if peek:
            return [m for m in postbox.peek(address, None) if m.id in wanted]
        for message_id in wanted:
            found = postbox.take_one(address, message_id)
            if found is not None:
                postbox.read(*found, "injected")
                taken.append(found[0])
        return sorted(taken, key=lambda m: m.id)

    def unread(self, address: str) -> int:
        """How many messages wait for ``address``."""
        return self._messaging.postbox.unread(address)

    def peers(self, address: str) -> list[PeerInfo]:
        """See :meth:`SubagentManager.peers`."""
        messaging = self._messaging
        me, peers = messaging.own(address), messaging.peers
        return [peers.info(p) for p in peers.tree(me.root, live_only=False) if p.address != address]

    async def ask(
        self,
        address: str,
        to: str,
        body: str,
        *,
        timeout: float | None = None,
        reply_to: str | None = None,
        wake: bool = True,
    ) -> Reply:
        """See :meth:`SubagentManager.ask` (``reply_to`` and ``wake`` as for a send)."""
        return await _message_waits.ask(
            self._messaging, address, to, body, timeout, self._lend, reply_to=reply_to, wake=wake
        )

    def send_input(self, task_id: str, text: str, *, session_id: str | None = None) -> Receipt:
        """See :meth:`SubagentManager.send_input` (``session_id``: only its own child)."""
        return self._messaging.send_input(self._sessions.require(task_id, session_id), text)

    async def activity(self, session_id: str, timeout: float | None) -> Activity:
        """See :meth:`SubagentManager.activity`."""
        limit = seconds("timeout", timeout, none_ok=True, zero_ok=True)
        try:
            self._messaging.own(session_id)
        except SpawnRejected:
            return Activity()
        inbox = _HostInbox(self._messaging, session_id)
        return await self._completions(session_id).activity(inbox, limit)

    # ------------------------------------------------------------------ for a running child

    def started(self, record: ChildRecord, ctx: object) -> None:
        """``record``'s runner starts with ``ctx`` (its responder's context)."""
        self._messaging.started(record, ctx)

    def previous(self, task_id: str) -> DelegateResult | None:
        """A follow-up run's previous envelope (see :attr:`RunContext.previous`)."""
        revival = self._messaging.revival(task_id)
        return None if revival is None else revival.previous

    def revived_by(self, task_id: str) -> list[Message]:
        """The messages that started follow-up run ``task_id`` (see
        :attr:`RunContext.revived_by`)."""
        revival = self._messaging.revival(task_id)
        return [] if revival is None else [message for message, _ in revival.messages]

    def asides(self, task_id: str) -> list[tuple[Message, Message | None]]:
        """See :meth:`RunContext.asides`."""
        return self._messaging.postbox.asides(task_id)

    def record(self, address: str) -> ChildRecord | None:
        """The record of the child at ``address`` (``None`` for a host session)."""
        return self._messaging.peers.of(address).record
