"""Peer messaging: sending (direct, broadcast, follow-up input), revival of resumable
agents, ``on_message`` responders, and the ``subagent.message`` events.

The waits (``recv``, ``ask``, ``activity``) are in :mod:`._message_waits`; the inboxes in
a :class:`~subagents._router.Postbox`; address resolution in :mod:`._peers`. Every send
is synchronous: it never blocks the sender. See design/messaging.md.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio

from ._envelope import DelegateResult, plain_str
from ._errors import ConfigError, SpawnRejected
from ._events import MESSAGE, EventBus
from ._messages import (
    BROADCAST,
    MAX_MESSAGE_CHARS,
    Message,
    MessageIds,
    Receipt,
)
from ._peers import Peer, Peers
from ._record import SETTLED, ChildRecord
from ._router import MemoryPostbox, Postbox

if TYPE_CHECKING:
    from ._sessions import Sessions

__all__ = ["Messaging", "Revival"]

logger = logging.getLogger("subagents.messages")

SpawnFollowUp = Callable[[ChildRecord, str], ChildRecord]
"""``spawn(ended_record, text)``: start the follow-up run of a resumable agent."""
StartTask = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


class Revival:
    """What a revived run was started with: the ended run's envelope and the message."""

    __slots__ = ("message", "previous", "receipt")

    def __init__(self, previous: DelegateResult, message: Message, receipt: Receipt) -> None:
        self.previous = previous
        self.message = message
        self.receipt = receipt


class Messaging:
    """One manager's messaging: the postbox, the peers, and what a send does.

    Args:
        sessions: the records (who is live, ended, queued; the trees).
        events: where ``subagent.message`` events go.
        capacity: unread messages per inbox.
        capture_content: whether events carry message bodies.
        spawn_follow_up: starts a resumable agent's follow-up run.
        start_task: runs a responder in the manager's task group.
    """

    def __init__(
        self,
        sessions: Sessions,
        events: EventBus,
        capacity: int,
        *,
        capture_content: bool,
        spawn_follow_up: SpawnFollowUp,
        start_task: StartTask,
        postbox: Postbox | None = None,
    ) -> None:
        self._sessions = sessions
        self._events = events
        self._capture = capture_content
        self._spawn_follow_up = spawn_follow_up
        self._start_task = start_task
        self.postbox: Postbox = (
            postbox if postbox is not None else MemoryPostbox(capacity, self._changed)
        )
        self.peers = Peers(sessions, self.postbox)
        self._ids = MessageIds()
        # The RunContext of each running child, for its responder (typed loosely: the
        # context module sits above this one).
        self._contexts: dict[str, Any] = {}
        self._forward: dict[str, str] = {}  # ended task id -> its follow-up run's id
        self.revivals: dict[str, Revival] = {}  # follow-up run's id -> what started it
        self._awaited: dict[str, float] = {}  # asked message ids -> the asker's deadline
        self._watched: set[str] = set()  # host sessions with an open inbox
        self.expecting: dict[str, anyio.Event] = {}  # asked message id -> its reply's event

    # ------------------------------------------------------------------ lifecycle hooks

    def started(self, record: ChildRecord, ctx: object) -> None:
        """``record``'s runner starts with ``ctx``. Its inbox opens when first used (or
        exists from while it was queued); a revival's message counts as read now."""
        if record.spec.on_message is not None:
            self._contexts[record.task_id] = ctx  # for its responder
        if self.revivals:
            revival = self.revivals.get(record.task_id)
            if revival is not None:
                self.postbox.read(revival.message, revival.receipt, "revived")

    def ended(self, record: ChildRecord) -> None:
        """``record`` has its envelope: its inbox closes, what waits in it fails
        ``ended`` naming it, and askers waiting on it return at once."""
        task_id = record.task_id
        if self._contexts:
            self._contexts.pop(task_id, None)
        if self.revivals:
            self.revivals.pop(task_id, None)
        if not self.postbox.is_open(task_id):
            return  # most children: never messaged, no inbox
        detail = (
            f"{record.agent_path} ({task_id}) ended before reading it; its result is in "
            f"the envelope of task {task_id}"
        )
        self.postbox.close(task_id, "ended", detail, task_id)

    def _open_host(self, session_id: str) -> None:
        if session_id in self._watched or self._sessions.is_closed(session_id):
            return
        self.postbox.open(session_id)
        self._watched.add(session_id)

    def closing(self, session_id: str | None) -> None:
        """Host session ``session_id`` starts closing (``None``: all, the manager closes):
        its inbox closes, what waits in it fails ``closed``."""
        if session_id is not None and session_id not in self._watched:
            return
        for closing in list(self._watched) if session_id is None else [session_id]:
            self._watched.discard(closing)
            self.postbox.close(closing, "closed", f"session {closing!r} was closed", None)

    def own(self, address: str) -> Peer:
        """The sender's own peer; its inbox opened. Raises :class:`SpawnRejected` for a
        child that is not running (a queued or ended one cannot send)."""
        peer = self.peers.of(address)
        if peer.record is None:
            if self._sessions.is_closed(address):
                raise SpawnRejected("session_closed", f"session {address!r} is closed")
            self._open_host(address)
        else:
            peer.record.check_can_delegate()
            self.postbox.open(address)
        return peer

    # ------------------------------------------------------------------ sending

    def send(
        self,
        sender: str,
        to: object,
        body: object,
        *,
        reply_to: object = None,
        wake: bool = True,
        awaited: float | None = None,
        revive: bool = True,
    ) -> Receipt:
        """Send ``body`` from ``sender`` to ``to``; never blocks. ``awaited`` (the asker's
        deadline, ``inf`` for none) makes it a question whose reply goes to the asker's
        own slot (:meth:`Postbox.expect`). See :meth:`SubagentManager.send`."""
        text = _body(body)
        address = plain_str(to)
        if address is None or not address.strip():
            raise ConfigError("to", "a task id, an agent path, or '*'", to)
        answers = None if reply_to is None else plain_str(reply_to)
        if reply_to is not None and not answers:
            raise ConfigError("reply_to", "None or the id of a message", reply_to)
        if not isinstance(wake, bool):
            raise ConfigError("wake", "True or False", wake)
        me = self.own(sender)
        if address.strip() in BROADCAST:
            if awaited is not None:
                raise ConfigError("to", "one agent's address: a broadcast cannot await a reply", to)
            return self._broadcast(me, text, answers, wake)
        peer = self.peers.resolve(me, address.strip())
        if peer.address == me.address:
            raise ConfigError("to", "another agent's address, not the sender's own", to)
        return self._direct(me, peer, text, answers, wake, awaited, revive)

    def _broadcast(self, me: Peer, text: str, reply_to: str | None, wake: bool) -> Receipt:
        receipts: list[Receipt] = []
        for peer in list(self.peers.tree(me.root, live_only=True)):
            if peer.address == me.address:
                continue
            if peer.record is None and self._sessions.is_closed(peer.address):
                continue
            if peer.record is not None and peer.record.ending:
                continue  # its outcome is decided: not live, and never revived
            message = self._message(me, peer.address, text, reply_to)
            receipts.append(self._deliver(me, peer, message, wake, None, revive=False))
        first = receipts[0].message_id if receipts else self._ids.next()[0]
        summary = Receipt(first, "*", tuple(receipts))
        if not receipts:
            summary.fail("unknown", "no live peer to broadcast to")
        return summary

    def _message(self, me: Peer, to: str, text: str, reply_to: str | None) -> Message:
        message_id, created = self._ids.next()
        self.postbox.touched(me.address, created)
        return Message(
            id=message_id, from_=me.address, to=to, body=text, reply_to=reply_to,
            created_ms=created,
        )  # fmt: skip

    def _direct(
        self,
        me: Peer,
        peer: Peer,
        text: str,
        reply_to: str | None,
        wake: bool,
        awaited: float | None,
        revive: bool,
    ) -> Receipt:
        peer = self._latest(peer)
        message = self._message(me, peer.address, text, reply_to)
        return self._deliver(me, peer, message, wake, awaited, revive=revive)

    def _latest(self, peer: Peer) -> Peer:
        """The run a message to ``peer`` reaches: an ended resumable agent's follow-up run."""
        seen = 0
        while peer.record is not None and peer.address in self._forward and seen < 1000:
            follow_up = self._sessions.get(self._forward[peer.address])
            if follow_up is None:
                break
            peer, seen = Peer(follow_up.task_id, follow_up, peer.root), seen + 1
        return peer

    def _deliver(
        self,
        me: Peer,
        peer: Peer,
        message: Message,
        wake: bool,
        awaited: float | None,
        *,
        revive: bool,
    ) -> Receipt:
        receipt = Receipt(message.id, peer.address)
        record = peer.record
        if message.reply_to is not None:
            self._mark_replied(me.address, message.reply_to)
        if record is not None and (record.state == SETTLED or record.envelope is not None):
            if revive and wake and record.spec.resumable and not record.sync:
                self._revive(record, message, receipt)
                if awaited is not None and receipt.task_id is not None and not receipt.failed:
                    self._expect(me, receipt.task_id, message, awaited)
            else:
                receipt.fail(
                    "ended",
                    f"{record.agent_path} ({record.task_id}) has ended; its result is in the "
                    f"envelope of task {record.task_id}",
                    record.task_id,
                )
        elif record is None and self._sessions.is_closed(peer.address):
            receipt.fail("closed", f"session {peer.address!r} is closed")
        else:
            if record is None:
                self._open_host(peer.address)
            else:
                self.postbox.open(peer.address)
            reading = False
            if awaited is not None:
                self._expect(me, peer.address, message, awaited)
                reading = self.postbox.reading(peer.address)  # before the put wakes it
            self.postbox.put(message, receipt, wake)
            if awaited is not None and receipt.failed:
                self.postbox.settle(me.address, message.id)
            elif awaited is not None and not reading and receipt.state == "queued":
                self._maybe_respond(peer, message)
        self._publish("send", me, message, receipt)
        return receipt

    def _expect(self, me: Peer, target: str, message: Message, deadline: float) -> None:
        self.expecting[message.id] = self.postbox.expect(me.address, message.id, target)
        self._awaited[message.id] = deadline

    def _mark_replied(self, replier: str, message_id: str) -> None:
        receipt = self.postbox.answered(replier, message_id)
        if receipt is not None and receipt.advance("replied"):
            self._changed(receipt)

    def _revive(self, record: ChildRecord, message: Message, receipt: Receipt) -> None:
        envelope = record.envelope
        assert envelope is not None
        try:
            follow_up = self._spawn_follow_up(record, message.body)
        except SpawnRejected as exc:
            receipt.fail(
                "ended",
                f"{record.agent_path} ({record.task_id}) has ended and could not be revived "
                f"({exc}); its result is in the envelope of task {record.task_id}",
                record.task_id,
            )
            return
        self._forward[record.task_id] = follow_up.task_id
        self.revivals[follow_up.task_id] = Revival(envelope, message, receipt)
        self.postbox.open(follow_up.task_id)
        receipt.revived(follow_up.task_id)

    def send_input(self, record: ChildRecord, text: object) -> Receipt:
        """Follow-up input from ``record``'s parent session; never revives."""
        return self.send(record.session_id, record.task_id, text, revive=False)

    # ------------------------------------------------------------------ responders

    def _maybe_respond(self, peer: Peer, message: Message) -> None:
        record = peer.record
        if record is None or record.spec.on_message is None:
            return
        ctx = self._contexts.get(peer.address)
        if ctx is None:
            return  # still queued: its runner reads it once it starts
        taken = self.postbox.take_one(peer.address, message.id)
        if taken is None:
            return
        self.postbox.read(*taken, "injected")  # the responder reads it, on the side
        responder = record.spec.on_message
        deadline = self._awaited.get(message.id, float("inf"))

        async def respond() -> None:
            await self._respond(peer.address, responder, message, ctx, deadline)

        self._start_task(respond)

    async def _respond(
        self,
        address: str,
        responder: Callable[[Message, Any], Awaitable[str | None]],
        message: Message,
        ctx: object,
        deadline: float,
    ) -> None:
        answer: object = None
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            try:
                answer = await responder(message, ctx)
            except Exception:
                logger.exception("the on_message responder of %s raised; no reply", address)
        reply = None
        text = plain_str(answer) if answer is not None else None
        if text and text.strip() and address in self._contexts:
            me = self.peers.of(address)
            reply = self._message(me, message.from_, _body(text), message.id)
            self._deliver(me, self.peers.of(message.from_), reply, True, None, revive=False)
        self.postbox.aside(address, message, reply)

    def awaited_done(self, message_id: str) -> None:
        """The asker of ``message_id`` stopped waiting."""
        self._awaited.pop(message_id, None)
        self.expecting.pop(message_id, None)

    # ------------------------------------------------------------------ events

    def _changed(self, receipt: Receipt) -> None:
        if self._events.active:
            peer = self.peers.of(receipt.to)
            self._emit("receipt", peer, None, receipt)

    def _publish(self, action: str, me: Peer, message: Message, receipt: Receipt) -> None:
        if self._events.active:
            self._emit(action, me, message, receipt)

    def _emit(self, action: str, peer: Peer, message: Message | None, receipt: Receipt) -> None:
        record = peer.record
        data: dict[str, Any] = {"action": action, "receipt": receipt.to_dict()}
        if message is not None:
            data["message"] = message.to_dict(body=self._capture)
        self._events.publish(
            MESSAGE,
            session_id=peer.address if record is None else record.session_id,
            task_id=peer.address,
            agent_path=peer.path,
            data=data,
        )


def _body(body: object) -> str:
    text = plain_str(body)
    expected = f"a non-empty string of at most {MAX_MESSAGE_CHARS} characters"
    if text is None or not text.strip():
        raise ConfigError("body", expected, body)
    if len(text) > MAX_MESSAGE_CHARS:
        raise ConfigError("body", expected + f" (it has {len(text)}; nothing was sent)", body)
    return text
