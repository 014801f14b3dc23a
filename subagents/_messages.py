"""Peer messaging records: :class:`Message`, :class:`Receipt`, :class:`PeerInfo`,
:class:`Reply`, and the bounds and names they use (design/messaging.md)."""

from __future__ import annotations

import itertools
from typing import Final, Literal, TypeAlias

import attrs

from ._envelope import DelegateResult, now_ms, plain_str
from ._errors import ConfigError
from ._json import JSONValue

__all__ = [
    "BROADCAST",
    "Activity",
    "Chain",
    "DEFAULT_INBOX_CAPACITY",
    "MAX_MESSAGE_CHARS",
    "Delivery",
    "FailureReason",
    "Message",
    "MessageIds",
    "PeerInfo",
    "PeerState",
    "Receipt",
    "ReceiptState",
    "Reply",
    "Revival",
    "message_body",
]

DEFAULT_INBOX_CAPACITY: Final = 100
"""Unread messages one agent's inbox holds; a send past it fails with ``full``."""
MAX_MESSAGE_CHARS: Final = 16_000
"""The longest body a message may have; a longer one is refused, never truncated."""
BROADCAST: Final = frozenset({"*", "all"})
"""The addresses meaning every live agent of the sender's tree but the sender."""

ReceiptState: TypeAlias = Literal["queued", "delivered", "read", "replied", "failed"]
FailureReason: TypeAlias = Literal["unknown", "ended", "full", "closed"]
Delivery: TypeAlias = Literal["injected", "woken", "revived"]
PeerState: TypeAlias = Literal["running", "queued", "idle", "ended"]

_RANK: Final[dict[str, int]] = {"queued": 0, "delivered": 1, "read": 2, "replied": 3}


@attrs.frozen(kw_only=True)
class Message:
    """One message between agents (or an agent and its host session)."""

    id: str
    """Unique per manager; ids sort by creation time."""
    from_: str
    """The sender's address: a task id, or a host session's id."""
    to: str
    """The recipient's address (a broadcast's copies each name their recipient)."""
    body: str
    """The text, at most :data:`MAX_MESSAGE_CHARS` characters."""
    reply_to: str | None = None
    """The id of the message this one answers, if any."""
    created_ms: int
    """Unix milliseconds when it was sent."""
    subject: str | None = None
    """A subject line: only a message from another process may have one (a room
    message's ``subject``); local sends have none."""

    def to_dict(self, *, body: bool = True) -> dict[str, JSONValue]:
        """A JSON-ready dict (without the content, the body and the subject, when
        ``body`` is False)."""
        out: dict[str, JSONValue] = {"id": self.id, "from": self.from_, "to": self.to}
        if body:
            out["body"] = self.body
        if self.reply_to is not None:
            out["reply_to"] = self.reply_to
        if body and self.subject is not None:
            out["subject"] = self.subject
        out["created_ms"] = self.created_ms
        return out


class MessageIds:
    """Message ids of one manager: ``m<ms:013d>-<n:08d>``, the millisecond never going back
    (a clock stepped backwards keeps the last one) and ``n`` counting every id, so they
    are unique and sort by creation."""

    __slots__ = ("_counter", "_last_ms")

    def __init__(self) -> None:
        self._counter = itertools.count(1)
        self._last_ms = 0

    def next(self) -> tuple[str, int]:
        """A new id and its creation time in unix milliseconds."""
        ms = self._last_ms = max(now_ms(), self._last_ms)
        return f"m{ms:013d}-{next(self._counter):08d}", ms


class Receipt:
    """What became of one message for one recipient; its state only moves forward.

    ``queued`` (in the recipient's inbox) → ``delivered`` (handed to the recipient at a
    delivery point) → ``read`` (taken by the recipient) → ``replied`` (it answered); or,
    from ``queued``, ``failed`` with a :attr:`reason`. :attr:`delivery` says how it
    reached the recipient. A broadcast's receipt has ``to == "*"`` and one receipt per
    recipient in :attr:`recipients`; its own state stays ``queued`` (or ``failed`` when it
    reached nobody). The object is live: the router updates it as things happen; to its
    holder it is read-only: every attribute is a property, and the moves are functions of
    this module that only the messaging modules call.
    """

    __slots__ = (
        "_delivery",
        "_detail",
        "_message_id",
        "_reason",
        "_recipients",
        "_state",
        "_task_id",
        "_to",
    )

    def __init__(self, message_id: str, to: str, recipients: tuple[Receipt, ...] = ()) -> None:
        self._message_id = message_id
        self._to = to
        self._recipients = tuple(recipients)
        self._state: ReceiptState = "queued"
        self._reason: FailureReason | None = None
        self._delivery: Delivery | None = None
        self._task_id: str | None = None
        self._detail = ""

    @property
    def message_id(self) -> str:
        """The message this receipt is about."""
        return self._message_id

    @property
    def to(self) -> str:
        """The recipient's address (``"*"`` for a broadcast)."""
        return self._to

    @property
    def recipients(self) -> tuple[Receipt, ...]:
        """A broadcast's per-recipient receipts (empty for a direct send)."""
        return self._recipients

    @property
    def state(self) -> ReceiptState:
        """``queued``, ``delivered``, ``read``, ``replied`` or ``failed``."""
        return self._state

    @property
    def reason(self) -> FailureReason | None:
        """Why it failed: ``unknown``, ``ended``, ``full`` or ``closed``; else ``None``."""
        return self._reason

    @property
    def delivery(self) -> Delivery | None:
        """``injected`` (a running recipient took it), ``woken`` (it woke a waiting
        recipient) or ``revived`` (it started a follow-up run); ``None`` until delivered."""
        return self._delivery

    @property
    def task_id(self) -> str | None:
        """For ``failed(ended)`` the task whose envelope holds the recipient's result; for
        a ``revived`` delivery the follow-up run's task id."""
        return self._task_id

    @property
    def detail(self) -> str:
        """One sentence on a failure, or on whom a broadcast left out, for a person or a
        model."""
        return self._detail

    @property
    def failed(self) -> bool:
        """True once the state is ``failed``."""
        return self._state == "failed"

    def to_dict(self) -> dict[str, JSONValue]:
        """A JSON-ready dict (what the ``subagent.message`` event and the tools carry)."""
        out: dict[str, JSONValue] = {
            "message_id": self.message_id,
            "to": self.to,
            "state": self._state,
        }
        if self._delivery is not None:
            out["delivery"] = self._delivery
        if self._reason is not None:
            out["reason"] = self._reason
        if self._reason is not None or self._detail:
            out["detail"] = self._detail
        if self._task_id is not None:
            out["task_id"] = self._task_id
        if self.recipients:
            out["recipients"] = [r.to_dict() for r in self.recipients]
        return out

    def __repr__(self) -> str:
        extra = f" {self._reason}" if self._reason else ""
        how = f" ({self._delivery})" if self._delivery else ""
        return f"<Receipt {self.message_id} to={self.to} {self._state}{extra}{how}>"


# The receipt's moves, kept off the class so that its holder cannot make it say what did
# not happen: only the messaging modules (the postbox, the sender) call these.


def advance(receipt: Receipt, state: ReceiptState, delivery: Delivery | None = None) -> bool:
    """Move ``receipt`` forward to ``state`` (never back, never out of ``failed``);
    ``delivery`` is kept from the first delivery. Returns whether anything changed."""
    if receipt._state == "failed" or state == "failed":
        return False
    if _RANK[state] <= _RANK[receipt._state]:
        return False
    if receipt._delivery is None and delivery is not None:
        receipt._delivery = delivery
    receipt._state = state
    return True


def fail(
    receipt: Receipt, reason: FailureReason, detail: str = "", task_id: str | None = None
) -> bool:
    """``queued`` → ``failed(reason)``; a receipt past ``queued`` keeps what happened."""
    if receipt._state != "queued":
        return False
    receipt._state, receipt._reason, receipt._detail = "failed", reason, detail
    if task_id is not None:
        receipt._task_id = task_id
    return True


def revived(receipt: Receipt, task_id: str) -> None:
    """``receipt`` was delivered as the input of the follow-up run ``task_id``."""
    if advance(receipt, "delivered", "revived"):
        receipt._task_id = task_id


def summary(receipt: Receipt, detail: str) -> None:
    """A broadcast's summary says ``detail`` (whom it left out) without failing."""
    receipt._detail = detail


@attrs.frozen(kw_only=True)
class PeerInfo:
    """One agent as :meth:`peers` lists it."""

    id: str
    """Its address: a task id, or a host session's id."""
    agent_path: str
    """Its place in the tree (``/root`` for a host session)."""
    agent: str
    """Its agent type (``"host"`` for a host session)."""
    state: PeerState
    """``running``, ``queued``, ``idle`` (waiting for a message) or ``ended``."""
    unread: int
    """Messages waiting in its inbox."""
    last_activity_ms: int
    """Unix milliseconds of its last start, end, send or receive."""

    def to_dict(self) -> dict[str, JSONValue]:
        """A JSON-ready dict."""
        return {
            "id": self.id,
            "agent_path": self.agent_path,
            "agent": self.agent,
            "state": self.state,
            "unread": self.unread,
            "last_activity_ms": self.last_activity_ms,
        }


ReplyOutcome: TypeAlias = Literal["replied", "timeout", "unknown", "ended", "full", "closed"]


@attrs.frozen(kw_only=True)
class Reply:
    """What :meth:`ask` returns: the reply, or why there is none."""

    outcome: ReplyOutcome
    """``replied``; ``timeout`` (no reply in time: the peer may still answer, and the
    late reply then waits in the inbox); or why no reply can come (the receipt's reason,
    or ``ended``: the peer ended while the asker waited)."""
    receipt: Receipt
    """The receipt of the question."""
    message: Message | None = None
    """The reply, when ``outcome`` is ``replied``."""


@attrs.frozen(kw_only=True)
class Activity:
    """What :meth:`SubagentManager.activity` woke for (peeked: nothing is consumed)."""

    results: list[DelegateResult] = attrs.field(factory=list)
    """Envelopes of ended children not collected yet, in completion order."""
    messages: list[Message] = attrs.field(factory=list)
    """Messages waiting in the session's inbox, oldest first."""

    def __bool__(self) -> bool:
        return bool(self.results or self.messages)


class Revival:
    """What a revived run was started with: the ended run's envelope and the messages
    (with their receipts) it reads as its input."""

    __slots__ = ("messages", "previous")

    def __init__(self, previous: DelegateResult, messages: list[tuple[Message, Receipt]]) -> None:
        self.previous = previous
        self.messages = messages


class Chain:
    """The runs of one resumable agent: every one of them forwards to the newest."""

    __slots__ = ("latest",)

    def __init__(self, latest: str) -> None:
        self.latest = latest


def message_body(body: object) -> str:
    """``body`` as a message's text; :class:`ConfigError` naming ``body`` otherwise."""
    text = plain_str(body)
    expected = f"a non-empty string of at most {MAX_MESSAGE_CHARS} characters"
    if text is None or not text.strip():
        raise ConfigError("body", expected, body)
    if len(text) > MAX_MESSAGE_CHARS:
        raise ConfigError("body", expected + f" (it has {len(text)}; nothing was sent)", body)
    return text
