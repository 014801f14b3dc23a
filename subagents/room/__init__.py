"""Coordination across the processes of one machine through the store's SQLite file, with
no daemon (see ``design/room.md``): members joining rooms, messages addressed by selectors
with one forward-only delivery row per recipient, file leases claimed atomically, drift
checks, liveness and a read-only history.

An edge of the core, like :mod:`subagents.store` (whose connections, retries, schema and
watcher it uses): the core never imports it.
"""

from __future__ import annotations

from ._bridge import RoomLink, bridge
from ._ids import HARNESS_KEY, MEMBER_ID, UnknownMember
from ._leases import LeaseNotHeld
from ._records import (
    AUTONOMY,
    DELIVERY_STATES,
    Autonomy,
    Claim,
    DeliveryState,
    Drift,
    Inbox,
    Joined,
    Lease,
    LeaseCheck,
    Liveness,
    Member,
    Message,
    Received,
    Sent,
    SentMessage,
    Severity,
)
from ._room import DEFAULT_LEASE_TTL, Room
from ._tools import room_tools

__all__ = [
    "AUTONOMY",
    "DEFAULT_LEASE_TTL",
    "DELIVERY_STATES",
    "HARNESS_KEY",
    "MEMBER_ID",
    "Autonomy",
    "Claim",
    "DeliveryState",
    "Drift",
    "Inbox",
    "Joined",
    "Lease",
    "LeaseCheck",
    "LeaseNotHeld",
    "Liveness",
    "Member",
    "Message",
    "Received",
    "Room",
    "RoomLink",
    "Sent",
    "SentMessage",
    "Severity",
    "UnknownMember",
    "bridge",
    "room_tools",
]

for _obj in (
    Claim,
    Drift,
    Inbox,
    Joined,
    Lease,
    LeaseCheck,
    LeaseNotHeld,
    Member,
    Message,
    Received,
    Room,
    RoomLink,
    Sent,
    SentMessage,
    UnknownMember,
    bridge,
    room_tools,
):
    _obj.__module__ = __name__
del _obj
