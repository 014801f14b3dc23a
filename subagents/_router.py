"""The postbox: every agent's inbox, its waiters and the receipts of what it was sent.

:class:`Postbox` is the seam for durability: the messaging layer only calls its methods,
all synchronous and O(1) or bounded per call, so a store can implement it to persist
messages and carry them across processes. :class:`MemoryPostbox` is the default.

Rules every implementation keeps (design/messaging.md): FIFO per (sender, recipient); a
message is in exactly one place (the inbox, a waiting ``ask``'s slot, or taken); a full
inbox refuses (``full``), a closed one refuses (``closed``); receipts only move forward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

import anyio

from ._messages import Delivery, FailureReason, Message, Receipt
from ._messages import advance as advance_receipt
from ._messages import fail as fail_receipt

__all__ = ["MAX_ANSWERABLE", "MAX_ASIDES", "MemoryPostbox", "Postbox"]

MAX_ANSWERABLE: Final = 1024
"""Read messages per inbox whose receipt a reply still marks ``replied`` (the newest)."""
MAX_ASIDES: Final = 64
"""Exchanges of an ``on_message`` responder an inbox keeps (the newest)."""

Aside = tuple[Message, "Message | None"]


class Postbox(Protocol):
    """Where messages wait for their recipients. Every method is synchronous."""

    def open(self, address: str) -> None:
        """Make ``address`` a live recipient (idempotent). The caller knows it is live:
        an ended agent or closed session is never opened again."""
        ...

    def is_open(self, address: str) -> bool:
        """Whether ``address`` takes messages now."""
        ...

    def put(
        self, message: Message, receipt: Receipt, wake: bool = True, revives: bool = False
    ) -> None:
        """Queue ``message`` for ``message.to``, or fail ``receipt`` (``full``, ``closed``);
        wake its waiters (its idle waiters only if ``wake``). ``revives``: left unread
        when a resumable recipient ends, it starts its follow-up run (not a broadcast)."""
        ...

    def take_reviving(self, address: str) -> list[tuple[Message, Receipt]]:
        """Remove and return the queued messages sent with ``revives``, oldest first,
        their receipts unchanged (the caller revives the recipient with them)."""
        ...

    def take(self, address: str, from_: str | None, limit: int | None) -> list[Message]:
        """Remove and return the oldest messages (from ``from_`` only, if given), marking
        their receipts delivered and read."""
        ...

    def take_one(self, address: str, message_id: str) -> tuple[Message, Receipt] | None:
        """Remove one queued message by id, marking it delivered (not read)."""
        ...

    def peek(self, address: str, from_: str | None) -> list[Message]:
        """The queued messages, oldest first, changing nothing."""
        ...

    def unread(self, address: str) -> int:
        """How many messages wait in ``address``'s inbox."""
        ...

    def waking(self, address: str) -> bool:
        """Whether a message sent with ``wake`` waits in ``address``'s inbox."""
        ...

    def watch(self, address: str, *, idle: bool = False, from_: str | None = None) -> anyio.Event:
        """An event set by the next arrival for ``address`` (from ``from_`` only, if
        given), or its closing; an ``idle`` waiter (a host loop between turns) only by a
        send that wakes."""
        ...

    def unwatch(self, address: str, event: anyio.Event) -> None:
        """Stop watching (the waiter is gone)."""
        ...

    def nudge(self, address: str) -> None:
        """Wake every waiter of ``address``'s inbox (each looks again, taking nothing)."""
        ...

    def waiting(self, address: str) -> int:
        """How many waiters ``address`` has (a recipient waiting is ``idle``)."""
        ...

    def reading(self, address: str, from_: str) -> bool:
        """Whether ``address`` waits now for a message that one from ``from_`` would end
        (a ``recv`` without a sender or for that one, an idle loop), so it reaches the
        runner at once (an ``ask`` waits for its reply only)."""
        ...

    def expect(self, asker: str, message_id: str, peer: str) -> anyio.Event:
        """``asker`` waits for a reply to ``message_id`` from ``peer``: the reply goes to
        its own slot, never the inbox; the event is set on it or when ``peer`` ends."""
        ...

    def redirect(self, asker: str, message_id: str, peer: str) -> None:
        """The question ``message_id`` revived its recipient: ``asker`` now waits for the
        reply of ``peer`` (the follow-up run), and for that one's end."""
        ...

    def settle(self, asker: str, message_id: str, keep: bool = True) -> Message | None:
        """Stop waiting for a reply: return it if it came (read), else ``None``; a reply
        arriving later goes to the inbox, as does one that came if not ``keep`` (the
        asker was cancelled: the reply must not be lost), in its place by id (FIFO per
        sender), even past the capacity, which it then exceeds by one."""
        ...

    def read(
        self, message: Message, receipt: Receipt, how: Delivery, reader: str | None = None
    ) -> None:
        """``message`` was taken outside the inbox (a reply, a responder, a revival) by
        ``reader`` (default ``message.to``; a revived run for a revival): keep its receipt
        so a reply of the reader marks it ``replied``."""
        ...

    def answered(self, replier: str, message_id: str, to: tuple[str, ...]) -> Receipt | None:
        """The receipt of ``message_id`` if ``replier`` read it and its sender is one of
        ``to`` (a reply that reached the asker marks it; one sent elsewhere does not)."""
        ...

    def close(self, address: str, reason: FailureReason, detail: str, task_id: str | None) -> None:
        """``address`` takes nothing more: fail what waits in its inbox, wake its waiters
        and the askers waiting on it, and forget it."""
        ...

    def last_activity(self, address: str) -> int | None:
        """Unix ms of the last message in or out of ``address``, if any."""
        ...

    def touched(self, address: str, when_ms: int) -> None:
        """``address`` sent a message at ``when_ms``."""
        ...

    def asides(self, address: str) -> list[Aside]:
        """The exchanges ``address``'s responder had, oldest first."""
        ...

    def aside(self, address: str, message: Message, reply: Message | None) -> None:
        """Record an exchange of ``address``'s responder."""
        ...


class _Entry:
    __slots__ = ("message", "receipt", "revives", "wakes", "woke")

    def __init__(
        self,
        message: Message,
        receipt: Receipt,
        woke: bool,
        wakes: bool = True,
        revives: bool = False,
    ) -> None:
        self.message = message
        self.receipt = receipt
        self.woke = woke  # a waiter was woken by it
        self.wakes = wakes  # sent with wake=True: an idle host loop wakes for it
        self.revives = revives  # unread when a resumable recipient ends: revives it


class _Ask:
    __slots__ = ("event", "peer", "reply")

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.event = anyio.Event()
        self.reply: tuple[Message, Receipt] | None = None


class _Inbox:
    __slots__ = ("answerable", "asides", "asks", "entries", "last_ms", "waiters")

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}  # by message id, oldest first
        # Each waiter: whether it is idle, and the one sender it waits for (or None).
        self.waiters: dict[anyio.Event, tuple[bool, str | None]] = {}
        self.asks: dict[str, _Ask] = {}  # by the id of the message asked
        # Read messages, by id, oldest first: the receipt and the message's sender.
        self.answerable: dict[str, tuple[Receipt, str]] = {}
        self.asides: deque[Aside] = deque(maxlen=MAX_ASIDES)
        self.last_ms = 0


class MemoryPostbox:
    """The in-memory :class:`Postbox` (the default).

    Args:
        capacity: unread messages per inbox (``full`` past it).
        on_change: called with each receipt that moved forward or failed (for events).
    """

    def __init__(self, capacity: int, on_change: Callable[[Receipt], None] | None = None) -> None:
        self._capacity = capacity
        self._inboxes: dict[str, _Inbox] = {}
        # Askers waiting on each peer: a peer's end wakes them at once.
        self._askers: dict[str, dict[tuple[str, str], None]] = {}
        self._on_change = on_change

    def open(self, address: str) -> None:
        if address not in self._inboxes:
            self._inboxes[address] = _Inbox()

    def is_open(self, address: str) -> bool:
        return address in self._inboxes

    def put(
        self, message: Message, receipt: Receipt, wake: bool = True, revives: bool = False
    ) -> None:
        inbox = self._inboxes.get(message.to)
        if inbox is None:
            fail_receipt(receipt, "closed", f"{message.to} takes no more messages")
            return
        inbox.last_ms = message.created_ms
        ask = inbox.asks.get(message.reply_to) if message.reply_to is not None else None
        if ask is not None and ask.reply is None and ask.peer == message.from_:
            # The reply a waiting ask expects: to its own slot, never the inbox, where
            # another reader could take it.
            ask.reply = (message, receipt)
            ask.event.set()
            return
        if len(inbox.entries) >= self._capacity:
            fail_receipt(
                receipt,
                "full",
                f"the inbox of {message.to} is full ({self._capacity} unread messages); "
                "nothing was dropped: send again once it has read some",
            )
            return
        woken = _wake(inbox, message.from_, wake)
        inbox.entries[message.id] = _Entry(message, receipt, woken, wake, revives)

    def take_reviving(self, address: str) -> list[tuple[Message, Receipt]]:
        inbox = self._inboxes.get(address)
        if inbox is None:
            return []
        found = [(k, e) for k, e in inbox.entries.items() if e.revives]
        for key, _ in found:
            del inbox.entries[key]
        return [(e.message, e.receipt) for _, e in found]

    def _taken(self, inbox: _Inbox, entry: _Entry, *, read: bool) -> None:
        receipt = entry.receipt
        how: Delivery = "woken" if entry.woke else "injected"
        changed = advance_receipt(receipt, "delivered", how)
        if read:
            changed = advance_receipt(receipt, "read") or changed
            self._answerable(inbox, entry.message, receipt)
        if changed and self._on_change is not None:
            self._on_change(receipt)

    def _answerable(self, inbox: _Inbox, message: Message, receipt: Receipt) -> None:
        answerable = inbox.answerable
        answerable[message.id] = (receipt, message.from_)
        if len(answerable) > MAX_ANSWERABLE:
            del answerable[next(iter(answerable))]

    def take(self, address: str, from_: str | None, limit: int | None) -> list[Message]:
        inbox = self._inboxes.get(address)
        if inbox is None or not inbox.entries:
            return []
        taken: list[Message] = []
        for key, entry in list(inbox.entries.items()):
            if limit is not None and len(taken) >= limit:
                break
            if from_ is not None and entry.message.from_ != from_:
                continue
            del inbox.entries[key]
            self._taken(inbox, entry, read=True)
            taken.append(entry.message)
        if taken:
            inbox.last_ms = max(inbox.last_ms, taken[-1].created_ms)
        return taken

    def take_one(self, address: str, message_id: str) -> tuple[Message, Receipt] | None:
        inbox = self._inboxes.get(address)
        entry = None if inbox is None else inbox.entries.pop(message_id, None)
        if inbox is None or entry is None:
            return None
        self._taken(inbox, entry, read=False)
        return entry.message, entry.receipt

    def peek(self, address: str, from_: str | None) -> list[Message]:
        inbox = self._inboxes.get(address)
        if inbox is None:
            return []
        return [
            e.message for e in inbox.entries.values() if from_ is None or e.message.from_ == from_
        ]

    def unread(self, address: str) -> int:
        inbox = self._inboxes.get(address)
        return 0 if inbox is None else len(inbox.entries)

    def waking(self, address: str) -> bool:
        inbox = self._inboxes.get(address)  # at most `capacity` entries to look at
        return inbox is not None and any(e.wakes for e in inbox.entries.values())

    def watch(self, address: str, *, idle: bool = False, from_: str | None = None) -> anyio.Event:
        event = anyio.Event()
        inbox = self._inboxes.get(address)
        if inbox is None:
            event.set()
        else:
            inbox.waiters[event] = (idle, from_)
        return event

    def unwatch(self, address: str, event: anyio.Event) -> None:
        inbox = self._inboxes.get(address)
        if inbox is not None:
            inbox.waiters.pop(event, None)

    def nudge(self, address: str) -> None:
        inbox = self._inboxes.get(address)
        if inbox is not None:
            for event in inbox.waiters:
                event.set()
            inbox.waiters.clear()

    def waiting(self, address: str) -> int:
        inbox = self._inboxes.get(address)
        return 0 if inbox is None else len(inbox.waiters) + len(inbox.asks)

    def reading(self, address: str, from_: str) -> bool:
        inbox = self._inboxes.get(address)
        return inbox is not None and any(
            sender is None or sender == from_ for _, sender in inbox.waiters.values()
        )

    def expect(self, asker: str, message_id: str, peer: str) -> anyio.Event:
        inbox = self._inboxes.get(asker)
        ask = _Ask(peer)
        if inbox is None or peer not in self._inboxes:
            ask.event.set()  # nobody can reply, or nobody can receive it
            return ask.event
        inbox.asks[message_id] = ask
        self._askers.setdefault(peer, {})[asker, message_id] = None
        return ask.event

    def redirect(self, asker: str, message_id: str, peer: str) -> None:
        inbox = self._inboxes.get(asker)
        ask = None if inbox is None else inbox.asks.get(message_id)
        if ask is None:
            return
        waiting = self._askers.get(ask.peer)
        if waiting is not None:
            waiting.pop((asker, message_id), None)
            if not waiting:
                del self._askers[ask.peer]
        ask.peer = peer
        if peer not in self._inboxes:
            ask.event.set()  # nobody can reply
            return
        self._askers.setdefault(peer, {})[asker, message_id] = None

    def settle(self, asker: str, message_id: str, keep: bool = True) -> Message | None:
        inbox = self._inboxes.get(asker)
        ask = None if inbox is None else inbox.asks.pop(message_id, None)
        if ask is None:
            return None
        waiting = self._askers.get(ask.peer)
        if waiting is not None:
            waiting.pop((asker, message_id), None)
            if not waiting:
                del self._askers[ask.peer]
        if ask.reply is None:
            return None
        message, receipt = ask.reply
        assert inbox is not None
        if not keep:
            _insert(inbox, _Entry(message, receipt, _wake(inbox, message.from_, True)))
            return None
        self._taken(inbox, _Entry(message, receipt, True), read=True)
        return message

    def read(
        self, message: Message, receipt: Receipt, how: Delivery, reader: str | None = None
    ) -> None:
        changed = advance_receipt(receipt, "delivered", how)
        changed = advance_receipt(receipt, "read") or changed
        inbox = self._inboxes.get(message.to if reader is None else reader)
        if inbox is not None:
            self._answerable(inbox, message, receipt)
        if changed and self._on_change is not None:
            self._on_change(receipt)

    def answered(self, replier: str, message_id: str, to: tuple[str, ...]) -> Receipt | None:
        inbox = self._inboxes.get(replier)
        found = None if inbox is None else inbox.answerable.get(message_id)
        if inbox is None or found is None or found[1] not in to:
            return None
        del inbox.answerable[message_id]
        return found[0]

    def close(self, address: str, reason: FailureReason, detail: str, task_id: str | None) -> None:
        inbox = self._inboxes.pop(address, None)
        if inbox is None:
            return
        for entry in inbox.entries.values():
            if fail_receipt(entry.receipt, reason, detail, task_id) and self._on_change is not None:
                self._on_change(entry.receipt)
        for event in inbox.waiters:
            event.set()
        for message_id, own in inbox.asks.items():
            own.event.set()
            peers_askers = self._askers.get(own.peer)
            if peers_askers is not None:
                peers_askers.pop((address, message_id), None)
                if not peers_askers:
                    del self._askers[own.peer]
        for asker, message_id in self._askers.pop(address, {}):
            waiting = self._inboxes.get(asker)
            ask = None if waiting is None else waiting.asks.get(message_id)
            if ask is not None:
                ask.event.set()

    def last_activity(self, address: str) -> int | None:
        inbox = self._inboxes.get(address)
        return None if inbox is None or not inbox.last_ms else inbox.last_ms

    def touched(self, address: str, when_ms: int) -> None:
        inbox = self._inboxes.get(address)
        if inbox is not None:
            inbox.last_ms = max(inbox.last_ms, when_ms)

    def asides(self, address: str) -> list[Aside]:
        inbox = self._inboxes.get(address)
        return [] if inbox is None else list(inbox.asides)

    def aside(self, address: str, message: Message, reply: Message | None) -> None:
        inbox = self._inboxes.get(address)
        if inbox is not None:
            inbox.asides.append((message, reply))


def _wake(inbox: _Inbox, sender: str, wake: bool) -> bool:
    """Wake the waiters a message from ``sender`` is for (the idle ones only if ``wake``);
    whether any was woken."""
    woken = [
        event
        for event, (idle, only) in inbox.waiters.items()
        if (wake or not idle) and (only is None or only == sender)
    ]
    for event in woken:
        del inbox.waiters[event]
        event.set()
    return bool(woken)


def _insert(inbox: _Inbox, entry: _Entry) -> None:
    """Put ``entry`` back in its place by id (ids sort by sending): O(capacity)."""
    entries = inbox.entries
    if not entries or next(reversed(entries)) < entry.message.id:
        entries[entry.message.id] = entry
        return
    merged = sorted([*entries.items(), (entry.message.id, entry)], key=lambda kv: kv[0])
    entries.clear()
    entries.update(merged)
