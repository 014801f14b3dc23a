"""The blocking side of messaging: ``recv`` and ``ask``, and taking from an inbox.

Every wait here lends the waiting child's slot (``lend``) and keeps its deadline around
the lend, so taking the slot back never outlasts the timeout; the message itself is only
ever taken synchronously after the wait, so a waiter cancelled at any point takes nothing
and loses nothing (design/messaging.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ._envelope import plain_str
from ._errors import ConfigError, UnknownPeer
from ._messages import Message, Reply
from ._remote import MEMBER_ID
from ._validators import seconds

if TYPE_CHECKING:
    from ._messaging import Messaging
    from ._router import Postbox

__all__ = ["ask", "message_ids", "recv", "take"]

Lend = Callable[[], AbstractAsyncContextManager[None]]


def _sender(messaging: Messaging, address: str, from_: object) -> str | None:
    if from_ is None:
        return None
    given = plain_str(from_)
    if not given:
        raise ConfigError("from_", "None or a task id or agent path", from_)
    me = messaging.peers.of(address)
    try:
        peer = messaging.peers.resolve(me, given)
    except UnknownPeer as exc:
        # A sender in another process, reached through the session's route: its address.
        if messaging.remotes.accepting(me.root, given) is None:
            raise messaging.remotes.unknown(exc) from None
        member = given.removeprefix("room:")
        if not MEMBER_ID.fullmatch(member):  # a selector names no one sender
            raise ConfigError(
                "from_", "one sender: a task id, an agent path or a room member's id", from_
            ) from None
        return member
    # A revived agent's newest run: what its follow-up sends matches its first id too.
    return messaging.newest(peer).address


def message_ids(ids: object) -> list[str]:
    """``ids`` (message ids, or messages) as a list of ids; :class:`ConfigError` naming
    ``ids`` otherwise. At most an inbox's worth is looked at per call."""
    expected = "None or a list of message ids (or messages) from inbox(peek=True)"
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise ConfigError("ids", expected, ids)
    out = []
    for item in ids:
        value = item.id if isinstance(item, Message) else plain_str(item)
        if not value:
            raise ConfigError("ids", expected, ids)
        out.append(value)
    return out


def take(
    messaging: Messaging,
    address: str,
    *,
    peek: bool,
    from_: object = None,
    limit: int | None = None,
) -> list[Message]:
    """The messages waiting for ``address`` (from ``from_`` only, if given), oldest first
    (the ``limit`` oldest): taken (receipts ``read``) unless ``peek``."""
    messaging.own(address)
    sender = _sender(messaging, address, from_)
    if peek:
        return messaging.postbox.peek(address, sender)[:limit]
    return messaging.postbox.take(address, sender, limit)


async def recv(
    messaging: Messaging, address: str, from_: object, timeout: object, lend: Lend
) -> Message | None:
    """The oldest message for ``address`` (from ``from_``), waiting up to ``timeout``
    seconds (``None``: until one comes or the inbox closes); ``None`` if none came."""
    limit = seconds("timeout", timeout, none_ok=True, zero_ok=True)
    messaging.own(address)
    sender = _sender(messaging, address, from_)
    postbox = messaging.postbox
    found = postbox.take(address, sender, 1)
    if found:
        return found[0]
    if limit == 0 or not postbox.is_open(address):
        await anyio.lowlevel.checkpoint()  # a polling loop still lets others run
        return None
    if limit is None:  # no deadline: no cancel scope either (the common, hot case)
        return await _wait_for_one(postbox, address, sender, lend)
    with anyio.move_on_after(limit):
        return await _wait_for_one(postbox, address, sender, lend)
    found = postbox.take(address, sender, 1)  # one landing at the deadline counts
    return found[0] if found else None


async def _wait_for_one(
    postbox: Postbox, address: str, sender: str | None, lend: Lend
) -> Message | None:
    """Wait (lending the slot) until a message from ``sender`` is taken, or the inbox
    closes (``None``). Taking is synchronous, after the wait: a cancelled waiter takes
    nothing."""
    while True:
        event = postbox.watch(address, from_=sender)
        try:
            async with lend():
                await event.wait()
        finally:
            postbox.unwatch(address, event)
        found = postbox.take(address, sender, 1)
        if found:
            return found[0]
        if not postbox.is_open(address):
            return None


async def ask(
    messaging: Messaging,
    address: str,
    to: object,
    body: object,
    timeout: object,
    lend: Lend,
    *,
    reply_to: object = None,
    wake: bool = True,
) -> Reply:
    """Send ``body`` to one peer (answering ``reply_to``, waking as ``wake`` says) and
    wait up to ``timeout`` seconds for its reply."""
    limit = seconds("timeout", timeout, none_ok=True, zero_ok=True)
    deadline = math.inf if limit is None else anyio.current_time() + limit
    receipt = messaging.send(address, to, body, reply_to=reply_to, wake=wake, awaited=deadline)
    if receipt.failed:
        assert receipt.reason is not None
        messaging.awaited_done(receipt.message_id)  # nothing left waiting for a reply
        await anyio.lowlevel.checkpoint()
        return Reply(outcome=receipt.reason, receipt=receipt)
    message_id = receipt.message_id
    event = messaging.expecting(message_id)
    postbox = messaging.postbox
    try:
        if event is not None and limit != 0:
            with anyio.move_on_after(math.inf if limit is None else limit):
                async with lend():
                    await event.wait()
    except BaseException:
        postbox.settle(address, message_id, keep=False)  # a reply that came stays unread
        messaging.awaited_done(message_id)
        raise
    reply = postbox.settle(address, message_id)
    # The run waited on, after the wait: a revival at its end moves it to the follow-up.
    target = messaging.target(message_id) or receipt.to
    messaging.awaited_done(message_id)
    if reply is not None:
        return Reply(outcome="replied", receipt=receipt, message=reply)
    if receipt.failed:
        assert receipt.reason is not None
        return Reply(outcome=receipt.reason, receipt=receipt)
    if not postbox.is_open(target):
        host = messaging.peers.of(target).record is None
        return Reply(outcome="closed" if host else "ended", receipt=receipt)
    if not postbox.is_open(address):
        return Reply(outcome="closed", receipt=receipt)
    return Reply(outcome="timeout", receipt=receipt)
