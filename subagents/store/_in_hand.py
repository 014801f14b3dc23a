"""The envelopes a mailbox put itself, kept in memory until taken, so that a take hands on
the object put instead of decoding its row.

A committed put is held by its delivery id (AUTOINCREMENT never gives one twice; an
envelope id would not do, the newest being free again once its task is forgotten), at
most ``capacity`` of them, the oldest let go first (another process may have taken
them); one still in ``Pending`` (its commit not reported yet) is found there.

:meth:`find` is also called from the writer thread, inside a take's transaction: it only
looks (dictionary lookups, each atomic), and what it finds is handed on as found, whatever
the event loop holds by the time the take's commit is reported.
"""

from __future__ import annotations

from collections.abc import Callable

from .._envelope import DelegateResult
from ._pending import Pending, Put
from ._takes import Taken

__all__ = ["InHand"]


class InHand:
    """One mailbox's envelopes in memory, by delivery id (see the module docstring)."""

    __slots__ = ("_capacity", "_held", "_pending")

    def __init__(self, pending: Pending, capacity: int) -> None:
        self._pending = pending
        self._capacity = capacity
        self._held: dict[int, DelegateResult] = {}

    def hold(self, put: Put) -> None:
        """``put`` is committed, unread: keep its envelope (unless it was consumed here)."""
        if put.claimed or put.taken:  # nobody takes it from the database
            return
        held = self._held
        held[put.delivery_id] = put.envelope
        if len(held) > self._capacity:
            del held[next(iter(held))]

    def has(self, task_id: str, delivery_id: int) -> bool:
        """Whether the envelope of delivery row ``delivery_id`` is here. A put the writer
        is writing has no id yet, or a newer one than any row committed: it never
        matches a committed row."""
        return delivery_id in self._held or self._pending.in_hand(task_id, delivery_id) is not None

    def take(self, task_id: str, delivery_id: int) -> DelegateResult:
        """The envelope :meth:`has` found, taken (its put's commit, reported later, finds
        it gone)."""
        envelope = self._held.pop(delivery_id, None)
        if envelope is not None:
            return envelope
        put = self._pending.in_hand(task_id, delivery_id)
        assert put is not None  # has() found it, in the same synchronous step
        self._pending.taken(put)
        return put.envelope

    def find(self, task_id: str, delivery_id: int, before: int) -> DelegateResult | None:
        """The envelope of delivery row ``delivery_id`` if it is here (nothing changes),
        looked up from a take submitted as write ``before``, in its transaction: a put
        submitted before it has its row's ids by then; one after may hold a rolled-back
        try's ids, which another row may have since."""
        envelope = self._held.get(delivery_id)
        if envelope is not None:
            return envelope
        put = self._pending.in_hand(task_id, delivery_id)
        return None if put is None or put.seq > before else put.envelope

    def handed(
        self, taken: list[Taken], decode: Callable[[bytes], DelegateResult]
    ) -> list[DelegateResult]:
        """The envelopes of a take's entries (see ``_takes``), a body decoded unless its
        envelope came in hand since the take looked (a put committed with it). Each is let
        go of here."""
        envelopes = []
        for task_id, delivery_id, found in taken:
            held = self._held.pop(delivery_id, None)
            if isinstance(found, bytes):
                envelopes.append(decode(found) if held is None else held)
                continue
            if held is None:
                put = self._pending.in_hand(task_id, delivery_id)
                if put is not None:
                    self._pending.taken(put)
            envelopes.append(found)
        return envelopes

    def let_go(self, delivery_id: int) -> None:
        """The row ``delivery_id`` was discarded: nobody takes its envelope."""
        self._held.pop(delivery_id, None)

    def clear(self) -> None:
        self._held.clear()
