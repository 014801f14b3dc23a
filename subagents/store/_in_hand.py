"""The envelopes a mailbox put itself, kept in memory until taken, so that a take hands on
the object put instead of decoding its row.

A committed put is held by its delivery id (AUTOINCREMENT never gives one twice; an
envelope id would not do, the newest being free again once its task is forgotten), at
most ``capacity`` of them, the oldest let go first (another process may have taken
them); one still in ``Pending`` (its commit not reported yet) is found there.
"""

from __future__ import annotations

from collections.abc import Callable

from .._envelope import DelegateResult
from ._pending import Pending, Put

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

    def envelopes(
        self,
        taken: list[tuple[str, int, int]],
        bodies: Callable[[list[int]], dict[int, bytes]],
        decode: Callable[[bytes], DelegateResult],
    ) -> list[DelegateResult]:
        """The envelopes of committed takes ``(task_id, delivery_id, envelope_id)``: those
        here as they were put, the others decoded from ``bodies(envelope_ids)`` (a row
        forgotten since the take is left out)."""
        here = {d for task_id, d, _ in taken if self.has(task_id, d)}
        missing = [e for _, d, e in taken if d not in here]
        found = bodies(missing) if missing else {}
        return [
            self.take(task_id, d) if d in here else decode(found[e])
            for task_id, d, e in taken
            if d in here or e in found
        ]

    def clear(self) -> None:
        self._held.clear()
