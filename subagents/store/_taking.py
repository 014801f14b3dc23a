"""A durable mailbox's synchronous takes (``drain``, ``drain_all``, and the lookup a
``discard`` makes): what the overlay decides alone, and the rest in the database on the
event loop's connection, through the writer's gate.

A pending put the writer has not taken yet is consumed here alone (``claimed``: its row
is then written as ``read`` in the first place). Anything else is taken by one
``UPDATE … RETURNING`` inside ``BEGIN IMMEDIATE``, after waiting through the gate for the
writer's transaction in flight, so a put the writer has taken is committed by the time
the take looks for it.
"""

from __future__ import annotations

import sqlite3

from .._envelope import DelegateResult, now_ms
from . import _deliveries as rows
from ._in_hand import InHand
from ._pending import Pending, Put
from ._sqlite import Connection

__all__ = ["LoopTakes"]


class LoopTakes:
    """One mailbox's takes on the event loop's connection; they return what they took,
    and the mailbox reports it consumed."""

    __slots__ = ("_conn", "_in_hand", "_pending", "_recipient", "_session", "consumer")

    def __init__(
        self,
        conn: Connection,
        pending: Pending,
        in_hand: InHand,
        *,
        session: str,
        recipient: str,
        consumer: str,
    ) -> None:
        self._conn = conn
        self._pending = pending
        self._in_hand = in_hand
        self._session = session
        self._recipient = recipient
        self.consumer = consumer

    def _decode(self, body: bytes) -> DelegateResult:
        return rows.decode(self._conn.path, body)

    def here(self, task_id: str, now: float) -> tuple[Put | None, bool]:
        """The overlay's part of a take of ``task_id``: ``(put, True)`` when it decides
        (``put`` consumed here, or ``None``: no entry), ``(put, False)`` when the database
        does (``put``: the id's entry in the writer's hands, if any)."""
        self._pending.expire(now)
        put = self._pending.get(task_id)
        if put is None:
            return None, self._pending.hides(task_id)
        if not put.live(now):  # an entry past its TTL before older ones (a clock step)
            if self._pending.uncommitted(task_id) is put:
                return None, True
            self._pending.discard(put)
            return None, False  # committed: the database says what the id holds now
        return put, self._pending.claim(put)

    def row(self, task_id: str, now: float) -> int:
        """The delivery id of ``task_id``'s live row in the database, or 0 (one read)."""
        session, recipient = self._session, self._recipient
        return self._conn.read(lambda raw: rows.find_row(raw, session, recipient, task_id, now))

    def one(self, task_id: str, put: Put | None, now: float) -> DelegateResult | None:
        """``task_id``'s entry from the database, after :meth:`here` left it to it;
        ``put``: the id's entry in the writer's hands."""
        session, recipient, consumer = self._session, self._recipient, self.consumer

        def exists(raw: sqlite3.Connection) -> bool:
            return rows.find(raw, session, recipient, task_id, now) is not None

        def take(raw: sqlite3.Connection) -> tuple[int, bytes | None] | None:
            # Gate held: ``put`` is committed, or handed back by a failed store: then it is
            # still the id's entry (taken below), not the stored row it was to replace.
            if put is not None and self._pending.handed_back(put):
                return None
            return rows.claim(
                raw,
                session,
                recipient,
                task_id,
                consumer=consumer,
                now=now,
                ms=now_ms(),
                known=self._in_hand.has,
            )

        taken = self._conn.write(
            take,
            # A put the writer has taken is waited for (through the gate), not looked up.
            precheck=exists if put is None else None,
        )
        envelope = None
        if taken is not None:
            delivery_id, body = taken
            envelope = (
                self._in_hand.take(task_id, delivery_id) if body is None else self._decode(body)
            )
        if put is not None and self._pending.get(task_id) is put:
            if taken is None and self._pending.claim(put):  # handed back by a failed store
                return put.envelope
            self._pending.discard(put)
        return envelope

    def all(self, now: float) -> list[DelegateResult]:
        """Every live entry, in arrival order: the database's and the overlay's."""
        self._pending.expire(now)
        session, recipient, consumer = self._session, self._recipient, self.consumer
        here: list[Put] = []

        def body(raw: sqlite3.Connection) -> list[tuple[str, int, bytes | None]]:
            # The gate is held, so the writer takes no put meanwhile: the ones it took are
            # committed (and taken below, unless another process took them), the rest are
            # consumed here, and their task ids' older rows are left for them to replace.
            here.extend(self._pending.claim_untaken())
            newer = [put.task_id for put in here] + self._pending.hidden_ids()
            taken = rows.claim_ids(
                raw, session, recipient, consumer=consumer, now=now, ms=now_ms(), excluding=newer
            )
            return rows.with_bodies(raw, taken, self._in_hand.has)

        def undo() -> None:  # the transaction rolled back; the gate is still held
            self._pending.unclaim(here)
            here.clear()

        def anything(raw: sqlite3.Connection) -> bool:  # to take, or to mark expired
            return rows.has_stored(raw, session, recipient)

        # With puts pending, always through the gate: one may be in the writer's hands.
        taken = self._conn.write(body, precheck=None if self._pending else anything, undo=undo)
        envelopes = [
            self._in_hand.take(task_id, delivery_id) if data is None else self._decode(data)
            for task_id, delivery_id, data in taken or ()
        ]
        self._pending.claimed_all(here)
        envelopes.extend(put.envelope for put in here if put.live(now))  # a clock step
        return envelopes
