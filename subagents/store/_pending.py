"""A mailbox's puts whose commit is not reported yet: readable in this process at once
(until their batch commits: then the database is read), and who gets each one decided
under the writer's lock.

A :class:`Put` goes to the writer thread's queue and into the mailbox's :class:`Pending`
at the same time. Until the writer takes it (``picked``), this process alone may consume
it (``claimed``: its row is then written as ``read``) or overwrite it (``superseded``: it
is never written). Once taken, the database decides: a take waits for the writer's
transaction through the gate and finds the row committed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from .._envelope import DelegateResult, now_ms
from . import _deliveries as rows
from ._writer import Write, Writer

__all__ = ["Pending", "Put", "is_uncommitted", "uncommitted_count", "uncommitted_ids"]


class Put(Write):
    """One put on its way to the database. ``picked``, ``claimed`` and ``superseded``
    change only under the writer's lock."""

    __slots__ = (
        "body",
        "claimed",
        "delivery_id",
        "envelope",
        "envelope_id",
        "expires_at",
        "on_failed",
        "on_written",
        "origin",
        "picked",
        "recipient",
        "session",
        "stored_at",
        "superseded",
        "taken",
        "task_id",
    )

    ORDER = 2  # after the journal's spawns and starts, before its ends (_journal_writes)

    def __init__(
        self,
        *,
        session: str,
        recipient: str,
        origin: str,
        task_id: str,
        envelope: DelegateResult,
        stored_at: float,
        expires_at: float | None,
        on_written: Callable[[Put], object],
        on_failed: Callable[[Put], object] | None = None,
    ) -> None:
        super().__init__()
        self.session = session
        self.recipient = recipient
        self.origin = origin
        self.task_id = task_id
        self.envelope = envelope
        self.body = envelope.to_json()
        self.stored_at = stored_at
        self.expires_at = expires_at
        self.on_written = on_written
        self.on_failed = on_failed
        self.envelope_id = 0
        """Its envelope row's id, once the writer has written it."""
        self.delivery_id = 0
        """Its delivery row's id, once the writer has written it (never another's)."""
        self.picked = False
        """The writer has taken it: it is in a transaction in flight, or committed."""
        self.claimed = False
        """Consumed in this process before the writer took it: written as ``read``."""
        self.superseded = False
        """Overwritten by a later put before the writer took it: never written."""
        self.taken = False
        """Consumed from the database by its own mailbox, before its commit was reported."""

    def live(self, now: float) -> bool:
        return self.expires_at is None or self.expires_at > now

    def take(self) -> bool:
        if self.superseded:
            return False
        self.picked = True
        return True

    def release(self) -> None:
        self.picked = False
        # Its transaction rolled back: no row has those ids for it.
        self.envelope_id = self.delivery_id = 0

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Put]) -> None:
        rows.insert(conn, writes, now_ms())

    def done(self) -> None:
        self.on_written(self)

    def failed(self) -> None:
        if self.on_failed is not None:
            self.on_failed(self)


def is_uncommitted(put: Put | None, committed: int) -> bool:
    """Whether ``put`` is a put whose batch is not committed at watermark ``committed``."""
    return put is not None and put.seq > committed


def uncommitted_ids(puts: dict[str, Put], committed: int) -> list[str]:
    """The task ids of ``puts`` whose batch is not committed at watermark ``committed``."""
    return [task_id for task_id, put in puts.items() if put.seq > committed]


def uncommitted_count(puts: dict[str, Put], committed: int) -> int:
    """How many of ``puts``, kept in submission order, are not committed at watermark
    ``committed``. The committed ones are the oldest, at most the batches whose report is
    on its way, so counting them from the front keeps this bounded on the put path."""
    done = 0
    for put in puts.values():
        if put.seq > committed:
            break
        done += 1
    return len(puts) - done


class Pending:
    """The puts of one mailbox whose commit has not been reported, by task id, in arrival
    order (the latest per id). Used from the event loop, with ``writer``'s lock."""

    def __init__(self, writer: Writer, *, expiring: bool) -> None:
        self._writer = writer
        self._lock = writer.lock
        self._expiring = expiring
        self._puts: dict[str, Put] = {}

    def __bool__(self) -> bool:
        return bool(self._puts)

    def get(self, task_id: str) -> Put | None:
        return self._puts.get(task_id)

    def task_ids(self) -> list[str]:
        return list(self._puts)

    def uncommitted(self, task_id: str) -> Put | None:
        """The put of ``task_id`` if its batch has not committed yet. Once it has, only the
        database says whether it is unread: another mailbox may have taken it before its
        commit is reported here."""
        put = self._puts.get(task_id)
        return put if is_uncommitted(put, self._writer.committed) else None

    def uncommitted_ids(self) -> list[str]:
        """The task ids of :meth:`uncommitted`'s puts."""
        return uncommitted_ids(self._puts, self._writer.committed)

    def uncommitted_count(self) -> int:
        """How many of :meth:`uncommitted`'s puts there are."""
        return uncommitted_count(self._puts, self._writer.committed)

    def add(self, put: Put) -> None:
        """``put`` (already submitted) becomes the newest arrival of its task id; an older
        pending put of the id that the writer has not taken is never written."""
        old = self._puts.pop(put.task_id, None)
        if old is not None:
            with self._lock:
                if not old.picked:
                    old.superseded = True
        self._puts[put.task_id] = put

    def live(self, now: float) -> int:
        """How many are live; the expired ones (the oldest first) are let go."""
        puts = self._puts
        if self._expiring:
            while puts:
                first = next(iter(puts.values()))
                if first.live(now):
                    break
                del puts[first.task_id]
        return len(puts)

    def discard(self, put: Put) -> None:
        """Forget ``put`` if it is still the pending one of its id."""
        if self._puts.get(put.task_id) is put:
            del self._puts[put.task_id]

    def claim(self, put: Put) -> bool:
        """Consume ``put`` here if the writer has not taken it yet (then it is forgotten
        and will be written as ``read``)."""
        with self._lock:
            if put.picked:
                return False
            put.claimed = True
        self.discard(put)
        return True

    def claim_untaken(self) -> list[Put]:
        """Consume every put the writer has not taken, in arrival order; they stay here
        until :meth:`clear` (or :meth:`unclaim`)."""
        with self._lock:
            untaken = [put for put in self._puts.values() if not put.picked]
            for put in untaken:
                put.claimed = True
        return untaken

    def unclaim(self, puts: list[Put]) -> None:
        """Undo :meth:`claim_untaken` (their transaction rolled back; the writer, kept out
        by the gate meanwhile, has taken none of them)."""
        with self._lock:
            for put in puts:
                put.claimed = False

    def clear(self) -> None:
        self._puts.clear()
