"""The manager's waits and messages, mixed into :class:`SubagentManager`: the slot a
waiting child lends, ``wait_result``, the two ways an idle host loop sleeps
(``completions`` and ``activity``), and the host session's side of messaging (``send``,
``recv``, ``inbox``, ``peers``, ``ask``, ``send_input``)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import anyio

from . import _message_waits
from ._completions import Completions
from ._envelope import DelegateResult
from ._errors import SpawnRejected
from ._limiter import SpawnLimiter
from ._messages import Activity, Message, PeerInfo, Receipt, Reply
from ._messaging import Messaging
from ._record import wait_for_record
from ._sessions import DEFAULT_SESSION, Sessions
from ._validators import seconds

__all__ = ["ManagerMessaging", "peers_of"]


class _HostInbox:
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


class ManagerMessaging:
    """The manager's waits, and messaging of its host sessions (design/messaging.md)."""

    _messaging: Messaging
    _sessions: Sessions
    _limiter: SpawnLimiter

    @property
    def running(self) -> bool:
        raise NotImplementedError  # the manager's

    def lend_slot(self) -> AbstractAsyncContextManager[None]:
        """Release the calling child's concurrency slot while the block runs, so queued
        children (its own among them) can run; take a slot back on exit, ahead of the
        queue, on a *borrowed* one (``statistics().borrowed``) if the block's deadline or
        cancellation ends the wait for it. Outside a spawned child it does nothing. Every
        blocking wait of the library that a child can reach uses it (design/core.md).
        """
        return self._limiter.lend_slot()

    async def wait_result(
        self,
        task_id: str,
        *,
        timeout: float | None = None,
        session_id: str | None = None,
    ) -> DelegateResult | None:
        """Wait for ``task_id`` to end, then collect (consume) and return its envelope.

        Returns ``None`` if ``timeout`` seconds pass first; a result landing at the deadline
        is returned. Collecting removes the entry from the session mailbox; the manager's
        record stays, so a second call returns the same envelope at once (see
        :attr:`SpawnHandle.collected`), unless ``config.retain_collected`` has forgotten it
        (then the id is unknown). Works when the mailbox was full.

        Raises:
            UnknownTask: unknown id, or (with ``session_id``) another session's.
            ConfigError: ``timeout`` not a number of seconds >= 0 or None.
        """
        timeout = seconds("timeout", timeout, none_ok=True, zero_ok=True)
        record = self._sessions.require(task_id, session_id)
        if record.envelope is None and timeout != 0:
            await wait_for_record(record, timeout, self.lend_slot())
        if record.envelope is None:
            return None
        self._sessions.collect(record)
        return record.envelope

    def send(
        self,
        to: str,
        body: str,
        *,
        reply_to: str | None = None,
        wake: bool = True,
        session_id: str = DEFAULT_SESSION,
    ) -> Receipt:
        """Send ``body`` from host session ``session_id`` to ``to``; never blocks.

        ``to`` is a task id, an agent path (absolute, or relative to the sender: below it
        first, then below the tree's root), a host session's id, or ``"*"``/``"all"``:
        every live agent of the sender's tree but the sender (a broadcast never revives
        an ended agent). ``wake=False`` neither wakes an idle host loop nor revives.

        Returns the receipt (live: it moves forward as the message is delivered, read and
        answered; a broadcast's lists one receipt per recipient). A message to an ended
        agent fails ``ended`` naming its task, unless its agent is resumable: then it
        starts one follow-up run (``revived``). A full inbox fails ``full``.

        Raises:
            ConfigError: an empty or too long body (``MAX_MESSAGE_CHARS``), the sender's
                own address, a malformed ``reply_to``. UnknownPeer: nobody at ``to`` (the
                message names the address probably meant). SpawnRejected: the session
                is closed.
        """
        return self._messaging.send(session_id, to, body, reply_to=reply_to, wake=wake)

    async def recv(
        self,
        *,
        from_: str | None = None,
        timeout: float | None = None,
        session_id: str = DEFAULT_SESSION,
    ) -> Message | None:
        """Take the oldest message sent to ``session_id`` (from ``from_`` only, if given),
        waiting up to ``timeout`` seconds (``None``: until one comes or the session
        closes). Returns ``None`` if none came; a message landing at the deadline counts.
        Cancelling the wait takes nothing."""
        lend = self.lend_slot
        return await _message_waits.recv(self._messaging, session_id, from_, timeout, lend)

    def inbox(
        self, *, peek: bool = False, from_: str | None = None, session_id: str = DEFAULT_SESSION
    ) -> list[Message]:
        """The messages waiting for ``session_id``, oldest first: taken (their receipts
        ``read``), or with ``peek`` left in place (receipts unchanged)."""
        return _message_waits.take(self._messaging, session_id, peek=peek, from_=from_)

    def peers(self, *, session_id: str = DEFAULT_SESSION) -> list[PeerInfo]:
        """Every agent of ``session_id``'s tree but the session itself (at most
        ``MAX_PEERS``, nearest the root first): live ones and ended ones not forgotten."""
        return peers_of(self._messaging, session_id)

    async def ask(
        self,
        to: str,
        body: str,
        *,
        timeout: float | None = None,
        session_id: str = DEFAULT_SESSION,
    ) -> Reply:
        """Send ``body`` to one agent and wait up to ``timeout`` seconds for the message
        that answers it (``reply_to`` its id, from that agent). The reply never lands in
        the inbox while this waits; a late one does. Returns at once with ``ended`` when
        the peer ends while this waits. Raises as :meth:`send` (and ``ConfigError`` for a
        broadcast)."""
        lend = self.lend_slot
        return await _message_waits.ask(self._messaging, session_id, to, body, timeout, lend)

    def send_input(self, task_id: str, text: str) -> Receipt:
        """Follow-up input for child ``task_id``, from the session that spawned it: a
        running child reads it at its next delivery point, a queued one once it starts;
        an ended child fails ``ended`` (follow-up input never revives).

        Raises:
            UnknownTask: no such id. ConfigError: an empty or too long text.
        """
        record = self._sessions.require(task_id)
        return self._messaging.send_input(record, text)

    def completions(self, session_id: str = DEFAULT_SESSION) -> Completions:
        """Wake an idle host loop when children of ``session_id`` end, consuming nothing.

        ``await manager.completions(sid)`` blocks until at least one child has ended with
        a result not yet collected and returns those envelopes (peeked: ``wait_agent``
        still collects them, and until then every call returns them again); it returns
        ``[]`` at once only when no ended child is uncollected and none is unfinished, or
        the session is closed. ``async for envelope in manager.completions(sid)`` yields each
        uncollected envelope once, in completion order, until no child is unfinished.
        Cancelling the waiter changes nothing. See :class:`~subagents.Completions`.
        Messages do not wake it: :meth:`activity` wakes on either.
        """
        return Completions(self._sessions, self.lend_slot, lambda: self.running, session_id)

    async def activity(
        self, session_id: str = DEFAULT_SESSION, *, timeout: float | None = None
    ) -> Activity:
        """Wake an idle host loop on either a finished child or a message, consuming nothing.

        Blocks until a child of ``session_id`` has ended uncollected or a message waits in
        its inbox (sent with ``wake=True``), and returns both (peeked). Returns an empty
        :class:`Activity` at once when there is neither and no child is unfinished, or the
        session is closed, and after ``timeout`` seconds.
        """
        limit = seconds("timeout", timeout, none_ok=True, zero_ok=True)
        try:
            self._messaging.own(session_id)
        except SpawnRejected:
            return Activity()
        inbox = _HostInbox(self._messaging, session_id)
        return await self.completions(session_id).activity(inbox, limit)


def peers_of(messaging: Messaging, address: str) -> list[PeerInfo]:
    """What ``peers()`` lists for ``address``."""
    me = messaging.own(address)
    peers = messaging.peers
    return [peers.info(p) for p in peers.tree(me.root, live_only=False) if p.address != address]
