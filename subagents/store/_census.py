"""How many live entries a mailbox holds, and whether it is full: the committed rows of
its session plus the puts of its overlay, counted without scanning on most puts."""

from __future__ import annotations

from . import _deliveries as rows
from ._pending import Pending
from ._sqlite import Connection
from ._tally import Tally

__all__ = ["Census"]


class Census:
    """One mailbox's counts (see ``design/store.md``, "Capacity and TTL across
    processes")."""

    __slots__ = ("_capacity", "_conn", "_pending", "_recipient", "_session", "_tally")

    def __init__(
        self,
        conn: Connection,
        pending: Pending,
        tally: Tally,
        *,
        session: str,
        recipient: str,
        capacity: int,
    ) -> None:
        self._conn = conn
        self._pending = pending
        self._tally = tally  # shared with the other objects of the session
        self._session = session
        self._recipient = recipient
        self._capacity = capacity

    def count(self, now: float, limit: int = -1, *, unrevealed: bool = False) -> int:
        """Live entries (at most ``limit``): the committed ones, plus the pending puts not
        committed yet (with ``unrevealed``, the durable puts not yet readable too)."""
        self._pending.expire(now)  # first: it lets the expired ones go
        pending, ids = self._pending.census(now, durable=unrevealed)
        excluding = ids or None
        session, recipient = self._session, self._recipient
        return pending + self._conn.read(
            lambda raw: rows.count_live(
                raw, session, recipient, now, limit=limit, excluding=excluding
            )
        )

    def full(self, now: float) -> bool:
        """At least ``capacity`` live entries, counting the durable puts on their way?

        Mostly no read at all: the last count of the committed entries plus this
        mailbox's uncommitted puts then, plus every put this process's objects of the
        session accepted since (:class:`Tally`), is more than it holds (entries consumed,
        expired or double-counted since only make it less), so below ``capacity`` it says
        "not full". Otherwise one bounded count; a put may commit between the two counts,
        so their sum only says "not full". A put committed but not reported yet is the
        database's to count: another process's mailbox may have taken it."""
        capacity = self._capacity
        self._pending.expire(now)  # first: it lets the expired ones go
        pending = self._pending.bound()
        if pending >= capacity:
            return self.count(now, limit=capacity, unrevealed=True) >= capacity
        tally = self._tally
        if tally.bound is not None and tally.bound + tally.since < capacity:
            return False
        session, recipient = self._session, self._recipient
        stored = self._conn.read(
            lambda raw: rows.count_live(raw, session, recipient, now, limit=capacity)
        )
        tally.bound, tally.since = stored + pending, 0
        if stored + pending < capacity:
            return False
        exact = not pending and not self._pending.hiding()  # nothing here changes ``stored``
        return exact or self.count(now, limit=capacity, unrevealed=True) >= capacity

    def accepted(self) -> None:
        """A put was accepted: the tally counts it until the next count."""
        self._tally.since += 1

    def stale(self) -> None:
        """Entries arrived that no put here counted."""
        self._tally.stale()
