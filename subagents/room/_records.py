"""The records a room answers with: members, messages and their deliveries, leases, drift.

Times are the room's clock (``Room(clock=...)``, by default ``time.time``): seconds, the
same clock in every process sharing the file.
"""

from __future__ import annotations

from typing import Final, Literal

import attrs

from .._json import JSONValue

__all__ = [
    "AUTONOMY",
    "DELIVERY_STATES",
    "LIVE",
    "Autonomy",
    "Claim",
    "DeliveryState",
    "Drift",
    "Inbox",
    "Joined",
    "Lease",
    "LeaseCheck",
    "Liveness",
    "Member",
    "Message",
    "Received",
    "Sent",
    "SentMessage",
    "Severity",
]

Autonomy = Literal["wake", "notify", "hold"]
AUTONOMY: Final[tuple[Autonomy, ...]] = ("hold", "notify", "wake")
"""The wake levels, lowest first."""
DeliveryState = Literal[
    "stored", "offered", "accepted", "read", "acked", "expired", "undeliverable"
]
LIVE: Final = "('stored', 'offered', 'accepted', 'undeliverable')"
"""The states of a delivery whose body is not taken, as SQL: the inbox index's condition
(repeated in a query's WHERE so the planner may use that partial index)."""
DELIVERY_STATES: Final[tuple[DeliveryState, ...]] = (
    "stored",
    "offered",
    "accepted",
    "read",
    "acked",
    "expired",
    "undeliverable",
)
Liveness = Literal["alive", "gone", "unknown"]
Severity = Literal["SAFE", "MINOR", "CRITICAL"]
LeaseMode = Literal["exclusive", "shared"]


@attrs.frozen(kw_only=True)
class Joined:
    """What :meth:`Room.join` answers."""

    member_id: str
    """The handle every other call takes."""
    rooms: tuple[str, ...]
    """The rooms the member is in now."""
    autonomy: Autonomy
    """The wake level in force."""
    warning: str | None = None
    """Set when a lower level was asked for on a re-join and refused, or a raise was capped."""


@attrs.frozen(kw_only=True)
class Member:
    """One member as :meth:`Room.who` reports it."""

    member_id: str
    """16 lower-case hex characters."""
    label: str
    """Given at join (``''``: none)."""
    tags: tuple[str, ...]
    """What ``tag:<tag>`` selectors match."""
    rooms: tuple[str, ...]
    """The rooms it is in, sorted."""
    cwd: str
    """Its working directory: relative lease paths and ``file:`` forms are read against it."""
    pid: int | None
    """The process that joined (``None``: none recorded)."""
    harness_key: str | None
    """The UUID it joined with, if any."""
    autonomy: Autonomy
    """Its wake level."""
    joined_at: float
    """When it first joined."""
    seen_at: float
    """The member's last call."""
    liveness: Liveness
    """``alive`` (its harness key is in a running process's environment, or its pid
    runs), ``gone`` (neither) or ``unknown`` (no pid recorded: not the same as gone)."""

    def to_dict(self) -> dict[str, JSONValue]:
        return {
            "member_id": self.member_id,
            "label": self.label,
            "tags": list(self.tags),
            "rooms": list(self.rooms),
            "cwd": self.cwd,
            "pid": self.pid,
            "autonomy": self.autonomy,
            "joined_at": self.joined_at,
            "seen_at": self.seen_at,
            "liveness": self.liveness,
        }


@attrs.frozen(kw_only=True)
class Sent:
    """What :meth:`Room.send` answers: the message stored, and to whom it goes."""

    message_id: int
    """The stored message."""
    recipients: tuple[str, ...]
    """Member ids, one delivery row each; empty is a legal send that reached nobody."""
    warning: str | None = None
    """Set when the selector resolved to nobody."""


@attrs.frozen(kw_only=True)
class Message:
    """One message, as a recipient receives it or a history lists it."""

    message_id: int
    """Unique in the store, in the order of sending."""
    sender: str
    """The sender's member id."""
    selector: str
    """The ``to`` it was sent with."""
    subject: str | None
    """A short subject, if any."""
    body: str
    """The text."""
    reply_to: int | None
    """The message it answers, if any."""
    created_at: float
    """When it was sent."""
    expires_at: float | None
    """When its untaken deliveries expire (``None``: never)."""

    def to_dict(self) -> dict[str, JSONValue]:
        return {
            "message_id": self.message_id,
            "from": self.sender,
            "to": self.selector,
            "subject": self.subject,
            "body": self.body,
            "reply_to": self.reply_to,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
        }


@attrs.frozen(kw_only=True)
class Inbox:
    """Where an empty receive looked, so "nothing for you" and "wrong place" differ."""

    member_id: str
    """The member that looked."""
    rooms: tuple[str, ...]
    """Its rooms."""
    deliveries: int
    """Deliveries this member ever had."""
    read: int
    """Of them, taken by a receive."""
    last_delivery_at: float | None
    """When its newest delivery was created (``None``: it never had one)."""

    def to_dict(self) -> dict[str, JSONValue]:
        return {
            "member_id": self.member_id,
            "rooms": list(self.rooms),
            "deliveries": self.deliveries,
            "read": self.read,
            "last_delivery_at": self.last_delivery_at,
        }


@attrs.frozen(kw_only=True)
class Received:
    """What :meth:`Room.receive` answers: the messages now marked read, or the inbox block."""

    messages: tuple[Message, ...]
    """In arrival order."""
    inbox: Inbox | None = None
    """Set when ``messages`` is empty."""


@attrs.frozen(kw_only=True)
class SentMessage:
    """One of a sender's messages with each recipient's delivery state."""

    message: Message
    """The message."""
    states: dict[str, DeliveryState]
    """Recipient member id to its delivery's state."""

    @property
    def pending(self) -> int:
        """Deliveries whose body nobody took yet (and that have not expired)."""
        return sum(
            s in ("stored", "offered", "accepted", "undeliverable") for s in self.states.values()
        )


@attrs.frozen(kw_only=True)
class Lease:
    """A member's claim on a path."""

    path: str
    """Absolute."""
    member_id: str
    """The holder."""
    mode: LeaseMode
    """``exclusive`` or ``shared``."""
    claimed_at: float
    """When it was first claimed (a renewal keeps it)."""
    expires_at: float
    """When it ends unless renewed."""

    def to_dict(self) -> dict[str, JSONValue]:
        return {
            "path": self.path,
            "member_id": self.member_id,
            "mode": self.mode,
            "claimed_at": self.claimed_at,
            "expires_at": self.expires_at,
        }


@attrs.frozen(kw_only=True)
class Claim:
    """What :meth:`Room.claim` answers."""

    ok: bool
    """Whether the lease is held now."""
    path: str
    """The path made absolute."""
    lease: Lease | None = None
    """The lease now held (when ``ok``)."""
    holder: Lease | None = None
    """A lease of another member that blocked the claim (when not ``ok``)."""
    reason: str = ""
    """Why it was refused (``claimed`` when ``ok``)."""
    at: float = 0.0
    """The room's clock inside the claim's transaction."""


@attrs.frozen(kw_only=True)
class LeaseCheck:
    """What :meth:`Room.check` answers: the live leases of a path (none: free)."""

    path: str
    """The path made absolute."""
    leases: tuple[Lease, ...]
    """Its live leases, oldest first."""

    @property
    def free(self) -> bool:
        return not self.leases


@attrs.frozen(kw_only=True)
class Drift:
    """What :meth:`Room.drift_check` answers."""

    path: str
    """The path made absolute."""
    severity: Severity
    """``SAFE``, ``MINOR`` or ``CRITICAL``."""
    changed: bool
    """Whether the file differs from the baseline (or is gone)."""
    holder: str | None = None
    """The other member whose lease makes it CRITICAL."""
    since: float | None = None
    """When that lease was claimed."""
    message: str = ""
    """What it means, for a model."""

    def to_dict(self) -> dict[str, JSONValue]:
        return {
            "path": self.path,
            "severity": self.severity,
            "changed": self.changed,
            "holder": self.holder,
            "since": self.since,
            "message": self.message,
        }
