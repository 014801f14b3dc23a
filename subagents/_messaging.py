"""Peer messaging: sending (direct, broadcast, follow-up input, to another process
through a session's remote route), revival of resumable agents, and the
``subagent.message`` events.

The waits (``recv``, ``ask``, ``activity``) are in :mod:`._message_waits`; the inboxes in
a :class:`~subagents._router.Postbox`; address resolution in :mod:`._peers`; the
``on_message`` responders in :mod:`._responders`; the remote routes in :mod:`._remote`.
Every send is synchronous: it never blocks the sender. See design/messaging.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from ._envelope import Status, now_ms, plain_str
from ._errors import ConfigError, SpawnRejected, UnknownPeer
from ._events import EventBus
from ._message_events import MessageEvents
from ._messages import (
    BROADCAST,
    Chain,
    Message,
    MessageIds,
    Receipt,
    Revival,
    message_body,
)
from ._messages import advance as advance_receipt
from ._messages import fail as fail_receipt
from ._messages import revived as revived_receipt
from ._messages import summary as summary_receipt
from ._peers import MAX_PEERS, Peer, Peers
from ._record import SETTLED, ChildRecord
from ._remote import RemoteRoute, Remotes
from ._responders import Responders, StartTask
from ._router import MemoryPostbox, Postbox

if TYPE_CHECKING:
    from ._sessions import Sessions

__all__ = ["Messaging", "Revival"]

SpawnFollowUp = Callable[[ChildRecord, str], ChildRecord]
"""``spawn(ended_record, text)``: start the follow-up run of a resumable agent."""
LinkReply = Callable[[ChildRecord | None, ChildRecord | None, str, str], None]
"""``link(replier, asker, reply_id, question_id)``: the reply's span links to the asker's."""
LinkRevival = Callable[[ChildRecord, ChildRecord], None]
"""``link(follow_up, ended)``: the follow-up run's span links to the run it revives."""


def _no_link(*args: object) -> None:
    return None


class Messaging:
    """One manager's messaging: the postbox, the peers, and what a send does.

    Args:
        sessions: the records (who is live, ended, queued; the trees).
        events: where ``subagent.message`` events go.
        capacity: unread messages per inbox.
        capture_content: whether events carry message bodies.
        spawn_follow_up: starts a resumable agent's follow-up run.
        start_task: runs a responder in the manager's task group.
        link_reply, link_revival: the tracing of replies and revivals.
        resumes: whether a child waiting with its slot lent would get it back at once.
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
        link_reply: LinkReply = _no_link,
        link_revival: LinkRevival = _no_link,
        resumes: Callable[[ChildRecord], bool] = lambda record: True,
    ) -> None:
        self._link_reply, self._link_revival = link_reply, link_revival
        self._resumes = resumes
        self._sessions = sessions
        self._events = MessageEvents(events, capture_content)
        self._spawn_follow_up = spawn_follow_up
        self.postbox: Postbox = (
            postbox if postbox is not None else MemoryPostbox(capacity, self._changed)
        )
        self.peers = Peers(sessions, self.postbox)
        self.remotes = Remotes(self._changed)
        self._ids = MessageIds()
        self._forward: dict[str, Chain] = {}  # each run of a revived agent -> its chain
        self._revivals: dict[str, Revival] = {}  # follow-up run's id -> what started it
        # Asked message ids -> the asker's deadline and the address asked.
        self._awaited: dict[str, tuple[float, str]] = {}
        self._watched: set[str] = set()  # host sessions with an open inbox
        self._expecting: dict[str, anyio.Event] = {}  # asked message id -> its reply's event
        self._responders = Responders(self.postbox, self._awaited, start_task, self._answer)

    # ------------------------------------------------------------------ lifecycle hooks

    def started(self, record: ChildRecord, ctx: object) -> None:
        """``record``'s runner starts with ``ctx``. Its inbox opens when first used (or
        exists from while it was queued); a revival's message counts as read now."""
        task_id = record.task_id
        if self._revivals:
            revival = self._revivals.get(task_id)
            if revival is not None:
                for message, receipt in revival.messages:
                    self.postbox.read(message, receipt, "revived", task_id)
        if record.spec.on_message is not None:
            self._responders.contexts[task_id] = ctx
            peer = Peer(task_id, record, record.root_session)
            for message in self.postbox.peek(task_id, None):  # asked while it was queued
                if message.id in self._awaited:
                    self._responders.maybe_respond(peer, message)

    def revival(self, task_id: str) -> Revival | None:
        """What started follow-up run ``task_id`` (while it runs), or ``None``."""
        return self._revivals.get(task_id) if self._revivals else None

    def forgotten(self, task_id: str) -> None:
        """The record of ``task_id`` is gone: so is its forwarding."""
        if self._forward:
            self._forward.pop(task_id, None)

    def ended(self, record: ChildRecord) -> None:
        """``record`` has its envelope: its inbox closes, what waits in it fails
        ``ended`` naming it, and askers waiting on it return at once."""
        task_id = record.task_id
        self._responders.ended(task_id)
        if self._revivals:
            self._revivals.pop(task_id, None)
        if not self.postbox.is_open(task_id):
            return  # most children: never messaged, no inbox
        # A cancelled run stays stopped: its caller asked for that, not for a new run.
        envelope = record.envelope
        cancelled = envelope is not None and envelope.status is Status.CANCELLED
        if record.spec.resumable and not record.sync and not cancelled:
            unread = self.postbox.take_reviving(task_id)
            if unread:
                follow_up = self._revive(record, unread)
                for message, receipt in unread:
                    if follow_up is not None and message.id in self._awaited:
                        self._follow(message, follow_up)
                    self._changed(receipt)
        detail = (
            f"{record.agent_path} ({task_id}) ended before reading it; its result is in "
            f"the envelope of task {task_id}"
        )
        self.postbox.close(task_id, "ended", detail, task_id)

    def _follow(self, message: Message, follow_up: str) -> None:
        # The question revived its recipient: its asker now waits for the follow-up run's
        # answer (and returns ``ended`` only when that run ends).
        deadline, _ = self._awaited[message.id]
        self._awaited[message.id] = (deadline, follow_up)
        self.postbox.redirect(message.from_, message.id, follow_up)

    def target(self, message_id: str) -> str | None:
        """The run an asked ``message_id`` waits on now (a revival moves it)."""
        awaited = self._awaited.get(message_id)
        return None if awaited is None else awaited[1]

    def _open_host(self, session_id: str) -> None:
        # Only a session that has (had) children: nobody could send to another, and an
        # inbox opened for any id passed in would never be closed.
        if session_id in self._watched or self._sessions.is_closed(session_id):
            return
        if not self._sessions.has_listing(session_id):
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
        text = message_body(body)
        address = plain_str(to)
        if address is None or not address.strip():
            raise ConfigError("to", "a task id, an agent path, or '*'", to)
        answers = None if reply_to is None else plain_str(reply_to)
        if reply_to is not None and (not answers or not answers.strip()):
            raise ConfigError("reply_to", "None or the id of a message", reply_to)
        if not isinstance(wake, bool):
            raise ConfigError("wake", "True or False", wake)
        me = self.own(sender)
        if address.strip() in BROADCAST:
            if awaited is not None:
                raise ConfigError("to", "one agent's address: a broadcast cannot await a reply", to)
            return self._broadcast(me, text, answers, wake)
        try:
            peer = self.peers.resolve(me, address.strip())
        except UnknownPeer as exc:
            route = self.remotes.accepting(me.root, address.strip())
            if route is None or self.remotes.local_typo(exc):
                raise self.remotes.unknown(exc, me.root) from None
            if route.is_self(address.strip()):
                raise ConfigError(
                    "to", "another agent's address, not the sender's own", to
                ) from None
            return self._remote(me, route, address.strip(), text, answers, wake, awaited)
        if peer.address == me.address:
            raise ConfigError("to", "another agent's address, not the sender's own", to)
        return self._direct(me, peer, text, answers, wake, awaited, revive)

    def _remote(
        self,
        me: Peer,
        route: RemoteRoute,
        to: str,
        text: str,
        reply_to: str | None,
        wake: bool,
        awaited: float | None,
    ) -> Receipt:
        # To another process: queued now, the route carries it (and fails it if it cannot).
        message = self._message(me, to, text, reply_to)
        receipt = Receipt(message.id, to)
        if awaited is not None:
            member = to.removeprefix("room:")  # a form not an id fails in the room
            if member == "*" or member.startswith(("file:", "tag:")):
                raise ConfigError("to", "one member's id: a selector cannot await a reply", to)
            self.remotes.asks[message.id] = (me.root, me.address, member)
            self.postbox.open(member)  # what the ask waits on, closed when no ask needs it
            self._expect(me, member, message, awaited)
        route.send(message, receipt, wake)
        if reply_to is not None and self._mark_replied(me.address, message, (to,)):
            self._link_reply(me.record, None, message.id, reply_to)
        self._events.publish("send", me, message, receipt)
        return receipt

    def attach_remote(self, session_id: str, route: RemoteRoute) -> None:
        """Messages of host session ``session_id``'s tree to addresses it does not know
        that ``route`` accepts go to ``route``; the session's inbox opens (it takes what
        comes from outside). Raises :class:`SpawnRejected` for a closed session."""
        if self._sessions.is_closed(session_id):
            raise SpawnRejected("session_closed", f"session {session_id!r} is closed")
        self.remotes.attach(session_id, route)
        self._watched.add(session_id)
        self.postbox.open(session_id)

    def detach_remote(self, session_id: str, route: RemoteRoute) -> None:
        """``session_id``'s route ``route`` is gone (nothing if another replaced it): its
        addresses are unknown again, and an ``ask`` of its tree waiting on one of them
        ends (``closed``); another session's ask of the same member waits on."""
        self.remotes.detach(session_id, route, self.postbox, self._awaited)

    def remote_stopped(self, session_id: str) -> None:
        """``session_id``'s route stopped bringing messages: a host waiting for activity
        looks again and each pending ask of its tree ends ``closed`` (nothing more can come)."""
        self.remotes.end_asks(session_id, self.postbox, self._awaited)
        self.postbox.nudge(session_id)

    def arrive(
        self, to: str, message_id: str, from_: str, body: str, reply_to: str | None,
        wake: bool, subject: str | None = None,
    ) -> Receipt:  # fmt: skip
        """A message from another process (``from_``: its sender there) into the inbox of
        ``to`` (a live address of this manager), through the postbox like any other:
        ``queued``, or failed (``full``, ``ended``, ``closed``)."""
        peer = self.peers.of(to)
        message = Message(
            id=message_id, from_=from_, to=to, body=body, reply_to=reply_to,
            created_ms=now_ms(), subject=subject,
        )  # fmt: skip
        return self._deliver(Peer(from_, None, peer.root), peer, message, wake, None, revive=False)

    def _broadcast(self, me: Peer, text: str, reply_to: str | None, wake: bool) -> Receipt:
        receipts: list[Receipt] = []
        walked = list(self.peers.tree(me.root, live_only=True))
        for peer in walked:
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
            fail_receipt(summary, "unknown", "no live peer to broadcast to")
        elif len(walked) >= MAX_PEERS:  # the host is one of the walked
            left_out = self.peers.live_count(me.root) - (len(walked) - 1)
            if left_out > 0:
                summary_receipt(
                    summary,
                    f"{left_out} live agent(s) past the {MAX_PEERS}-agent broadcast cap got "
                    "no copy; send to them by id or path",
                )
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
        addressed, peer = peer.address, self.newest(peer)
        message = self._message(me, peer.address, text, reply_to)
        return self._deliver(me, peer, message, wake, awaited, revive=revive, addressed=addressed)

    def newest(self, peer: Peer) -> Peer:
        """The run a message to ``peer`` reaches: a revived agent's newest run (O(1))."""
        chain = self._forward.get(peer.address) if self._forward else None
        if chain is None or chain.latest == peer.address:
            return peer
        newest = self._sessions.get(chain.latest)
        return peer if newest is None else Peer(newest.task_id, newest, peer.root)

    def _deliver(
        self,
        me: Peer,
        peer: Peer,
        message: Message,
        wake: bool,
        awaited: float | None,
        *,
        revive: bool,
        addressed: str | None = None,
    ) -> Receipt:
        receipt = Receipt(message.id, peer.address)
        record = peer.record
        if record is not None and (record.state == SETTLED or record.envelope is not None):
            if revive and wake and record.spec.resumable and not record.sync:
                self._revive(record, [(message, receipt)])
                if awaited is not None and receipt.task_id is not None and not receipt.failed:
                    self._expect(me, receipt.task_id, message, awaited)
            else:
                fail_receipt(
                    receipt,
                    "ended",
                    f"{record.agent_path} ({record.task_id}) has ended; its result is in the "
                    f"envelope of task {record.task_id}",
                    record.task_id,
                )
        elif record is None and self._sessions.is_closed(peer.address):
            fail_receipt(receipt, "closed", f"session {peer.address!r} is closed")
        else:
            if record is None:
                self._open_host(peer.address)
            else:
                self.postbox.open(peer.address)
            reading = False
            if awaited is not None:
                self._expect(me, peer.address, message, awaited)
                # Before the put wakes it: would a waiter of its runner take this one?
                # A waiter whose slot another child holds cannot take it soon: then its
                # responder answers.
                reading = self.postbox.reading(peer.address, me.address) and (
                    record is None or self._resumes(record)
                )
            self.postbox.put(message, receipt, wake, revives=revive and wake)
            if awaited is not None and receipt.failed:
                self.postbox.settle(me.address, message.id)
            elif awaited is not None and not reading and receipt.state == "queued":
                self._responders.maybe_respond(peer, message)
        # The span link goes to the question's asker: only a reply that reached it.
        to = (addressed or peer.address, peer.address)
        if (
            message.reply_to is not None
            and not receipt.failed
            and self._mark_replied(me.address, message, to)
        ):
            self._link_reply(me.record, peer.record, message.id, message.reply_to)
        self._events.publish("send", me, message, receipt)
        return receipt

    def _expect(self, me: Peer, target: str, message: Message, deadline: float) -> None:
        self._expecting[message.id] = self.postbox.expect(me.address, message.id, target)
        self._awaited[message.id] = (deadline, target)

    def expecting(self, message_id: str) -> anyio.Event | None:
        """The event a reply to the asked ``message_id`` sets, while its asker waits."""
        return self._expecting.get(message_id)

    def _mark_replied(self, replier: str, reply: Message, to: tuple[str, ...]) -> bool:
        # Only a reply that reached the question's sender marks it: never one sent elsewhere.
        assert reply.reply_to is not None
        receipt = self.postbox.answered(replier, reply.reply_to, to)
        if receipt is not None and advance_receipt(receipt, "replied"):
            self._changed(receipt)
        return receipt is not None

    def _revive(self, record: ChildRecord, messages: list[tuple[Message, Receipt]]) -> str | None:
        """Start ``record``'s follow-up run with ``messages`` as its input (one run); its
        task id, or ``None`` when it could not start (the receipts failed)."""
        envelope = record.envelope
        assert envelope is not None
        if len(messages) == 1:
            text = messages[0][0].body
        else:
            text = "\n\n".join(f"[{m.id}] from {m.from_}: {m.body}" for m, _ in messages)
        try:
            follow_up = self._spawn_follow_up(record, text)
        except SpawnRejected as exc:
            detail = (
                f"{record.agent_path} ({record.task_id}) has ended and could not be revived "
                f"({exc}); its result is in the envelope of task {record.task_id}"
            )
            for _, receipt in messages:
                fail_receipt(receipt, "ended", detail, record.task_id)
            return None
        self._link_revival(follow_up, record)
        chain = self._forward.get(record.task_id)
        if chain is None:
            chain = self._forward[record.task_id] = Chain(follow_up.task_id)
        chain.latest = follow_up.task_id
        self._forward[follow_up.task_id] = chain
        self._revivals[follow_up.task_id] = Revival(envelope, messages)
        self.postbox.open(follow_up.task_id)
        for _, receipt in messages:
            revived_receipt(receipt, follow_up.task_id)
        return follow_up.task_id

    def send_input(self, record: ChildRecord, text: object) -> Receipt:
        """Follow-up input from ``record``'s parent session; never revives."""
        return self.send(record.session_id, record.task_id, text, revive=False)

    def _answer(self, address: str, question: Message, body: str) -> Message:
        # A responder's reply, sent as its agent.
        me = self.peers.of(address)
        reply = self._message(me, question.from_, body, question.id)
        self._deliver(me, self.peers.of(question.from_), reply, True, None, revive=False)
        return reply

    def awaited_done(self, message_id: str) -> None:
        """The asker of ``message_id`` stopped waiting: its responder, if any, stops."""
        awaited = self._awaited.pop(message_id, None)
        self._expecting.pop(message_id, None)
        if self.remotes.asks:
            self.remotes.asks.pop(message_id, None)
        if awaited is not None:
            self._responders.stop(awaited[1], message_id)

    # ------------------------------------------------------------------ events

    def _changed(self, receipt: Receipt) -> None:
        if self.remotes.active:
            self.remotes.changed(receipt)
            # A question a route failed: its asker returns at once, as for a local one.
            asked = self._expecting.get(receipt.message_id) if receipt.failed else None
            if asked is not None:
                asked.set()
        if self._events.active:
            self._events.publish("receipt", self.peers.of(receipt.to), None, receipt)
