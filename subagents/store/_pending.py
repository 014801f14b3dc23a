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
from ._in_order import InOrder, is_uncommitted
from ._takes import Discard, GiveBack, TakeAll
from ._writer import Write, Writer

__all__ = ["Pending", "Put"]


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


class Pending:
    """A mailbox's puts whose commit has not been reported, by task id, in submission
    order (the latest per id), in three kinds. Used from the event loop, with ``writer``'s
    lock.

    - entries: :meth:`add`'s puts, readable here (until their batch commits);
    - durable ones: :meth:`add_durable`'s puts, readable once committed, counted at once;
    - hiding ones: puts consumed here (:meth:`claim`) or expired before their batch
      committed, and discards on their way (:meth:`discarding`). They hold no entry, but
      until the commit writes them their id's older row is not the id's entry, so the
      database is not asked about it.

    Once a put's batch has committed, the database answers for it, whatever is here.
    """

    def __init__(self, writer: Writer, *, expiring: bool) -> None:
        self._writer = writer
        self._lock = writer.lock
        self._expiring = expiring
        self._puts: InOrder[Put] = InOrder()
        self._durable: InOrder[Put] = InOrder()
        self._hiding: InOrder[Put | Discard] = InOrder()
        self._taking: list[TakeAll] = []  # this mailbox's takes under way, in submission order
        # Overwritten here (by the put of the sequence number beside it), still to be
        # written for a take submitted between the two.
        self._kept: list[tuple[Put, int]] = []
        self._giving: list[GiveBack] = []  # their rows count as entries until they end
        # The rows discarded while a take or a give-back is under way (a discard's target,
        # or a row a take holds already), which no take takes nor give-back makes unread;
        # under the lock.
        self._forgone: set[Discard] = set()
        self._forgone_rows: set[int] = set()

    def __bool__(self) -> bool:
        """Whether there are entries (one may be in the writer's hands)."""
        return bool(self._puts)

    def __len__(self) -> int:
        return len(self._puts)

    def get(self, task_id: str) -> Put | None:
        """The entry of ``task_id``, committed or not."""
        return self._puts.get(task_id)

    def uncommitted(self, task_id: str) -> Put | None:
        """The entry of ``task_id`` if its batch has not committed yet. Once it has, only the
        database says whether it is unread: another mailbox may have taken it before its
        commit is reported here."""
        put = self._puts.get(task_id)
        return put if is_uncommitted(put, self._writer.committed) else None

    def holds(self, task_id: str) -> bool:
        """Whether an uncommitted put of ``task_id`` holds an entry here (a put of the id
        replaces it, so it adds none), or its row is being given back."""
        return (
            self.uncommitted(task_id) is not None
            or is_uncommitted(self._durable.get(task_id), self._writer.committed)
            or (bool(self._giving) and task_id in self._given_ids())
        )

    def hides(self, task_id: str) -> bool:
        """Whether a put of ``task_id`` that holds no entry is on its way: then the
        database's row of the id is an older one, about to be replaced."""
        return is_uncommitted(self._hiding.get(task_id), self._writer.committed)

    def answer(self, task_id: str, now: float) -> tuple[bool, DelegateResult | None]:
        """``(True, entry or None)`` when this answers for ``task_id``; ``(False, None)``
        when the database does."""
        put = self.uncommitted(task_id)
        if put is not None:
            return True, put.envelope if put.live(now) else None
        return (True, None) if self.hides(task_id) else (False, None)

    def bound(self) -> int:
        """At least the uncommitted puts that hold an entry (an id counted in both kinds
        counts twice), and the rows being given back."""
        committed = self._writer.committed
        return (
            self._puts.uncommitted(committed)
            + self._durable.uncommitted(committed)
            + self._given_count()
        )

    def giving(self, back: GiveBack) -> GiveBack:
        """A take's rows are being given back (read in the database until it commits)."""
        self._giving.append(back)
        return back

    def given(self, back: GiveBack) -> None:
        self._giving.remove(back)
        self._forget_forgone()

    def _given_count(self) -> int:
        return len(self._given_ids()) if self._giving else 0

    def _given_ids(self) -> set[str]:
        """The ids whose rows a give-back holds: its take applied (to this process's reads
        they are read, or about to be, and are not counted there), itself not committed."""
        committed = self._writer.committed
        forgone = self.forgone()
        return {
            task_id
            for back in self._giving
            if not 0 < back.seq <= committed
            for task_id, delivery_id, _ in back.of.taken or ()
            if delivery_id not in forgone  # else it is not given back
        }

    def census(self, now: float, *, durable: bool) -> tuple[int, list[str]]:
        """How many ids hold a live uncommitted entry here (with ``durable``, a durable put
        too), plus the rows being given back, and the ids the database must not count:
        those of every uncommitted put here (an entry past its TTL out of turn, after a
        clock step, still hides)."""
        committed = self._writer.committed
        uncommitted = [put for put in self._puts.values() if put.seq > committed]
        ids = [put.task_id for put in uncommitted]
        held = {put.task_id for put in uncommitted if put.live(now)}
        if durable:
            durable_ids = [p.task_id for p in self._durable.values() if p.seq > committed]
            held.update(durable_ids)
            ids.extend(durable_ids)
        hidden = self.hidden_ids()
        given: set[str] = set()
        if self._giving:
            # An id put here since is that put's, whichever commits first: a newer row is
            # not given back, and a given-back row is retired by the put's insert.
            newer = {*ids, *hidden, *(p.task_id for p in self._durable.values())}
            given = self._given_ids() - newer
        return len(held | given), [*ids, *given, *hidden]

    def hidden_ids(self) -> list[str]:
        committed = self._writer.committed
        return [put.task_id for put in self._hiding.values() if put.seq > committed]

    def hiding(self) -> bool:
        """Whether any put may hide its id's older row (then a count of the database's
        rows alone is too high)."""
        return bool(self._hiding)

    def taking(self, take: TakeAll) -> None:
        """``take``, of this mailbox's entries, was submitted: an entry put before it and
        overwritten after it is still written, for the take to take."""
        self._taking.append(take)

    def took(self, take: TakeAll) -> None:
        """``take`` ended (committed, withdrawn, or the store failed first): an
        entry it kept that no take under way keeps is never written, if the writer has not
        taken it (a withdrawn take's)."""
        if take in self._taking:
            self._taking.remove(take)
        self._forget_forgone()
        if not self._kept:
            return
        kept = []
        with self._lock:
            for put, by in self._kept:
                if put.picked:
                    continue
                if any(put.seq < take.seq < by for take in self._taking):
                    kept.append((put, by))
                else:
                    put.superseded = True
        self._kept = kept

    def add(self, put: Put) -> None:
        """``put`` (already submitted) becomes the newest entry of its task id; an older
        entry of the id that the writer has not taken is never written, unless a take
        submitted between the two is to take it."""
        old = self._puts.latest(put)
        if old is not None:
            with self._lock:
                if not old.picked:
                    if self._taking and old.seq < self._taking[-1].seq:
                        self._kept.append((old, put.seq))
                    else:
                        old.superseded = True
        self._durable.pop(put.task_id)  # counted from now on as the entry

    def add_durable(self, put: Put) -> None:
        self._durable.latest(put)

    def revealed(self, put: Put) -> None:
        """``put`` (a durable one) has committed: the database has it from now on."""
        self._durable.forget(put)

    def keep(self, put: Put) -> bool:
        """The store failed before committing ``put`` (a durable one): it becomes an entry,
        readable here alone, if no later put of its id came since."""
        if not self._durable.forget(put):
            return False
        # In its place among the entries, by submission: :meth:`expire` reads them oldest
        # first, and its TTL passes before those of the entries put after it.
        self.add(put)
        return True

    def expire(self, now: float) -> None:
        """Let the expired entries (the oldest first) go; those not committed yet hide."""
        puts = self._puts
        if self._expiring:
            committed = self._writer.committed
            while (first := puts.first()) is not None and not first.live(now):
                puts.pop(first.task_id)
                if first.seq > committed:
                    self._hiding.latest(first)

    def discard(self, put: Put) -> None:
        """Forget ``put`` (its commit is reported, or the database took it)."""
        self._puts.forget(put)
        self._hiding.forget(put)

    def claim(self, put: Put) -> bool:
        """Consume ``put`` here if the writer has not taken it yet (then it hides its id
        until it is written, as ``read``)."""
        with self._lock:
            if put.picked:
                return False
            put.claimed = True
        if self._puts.forget(put):
            self._hiding.latest(put)
        return True

    def discarding(self, discard: Discard) -> None:
        """``discard`` (submitted) consumes its id's entry for nobody: its put (one the
        writer has taken; an untaken one is claimed instead) is let go, its row the
        discard's to mark read; until it commits, the database's row of the id is not
        its entry (the takes under way leave the row alone: :meth:`forgo`)."""
        put = discard.of
        if isinstance(put, Put) and self._puts.forget(put):
            put.taken = True  # nobody takes it from the database: the discard marks it
        self._hiding.latest(discard)

    def discarded(self, discard: Discard, committed: bool) -> None:
        """``discard``'s commit is reported, or the store failed first: then it hides its
        id for good (the watermark moves no more), as a claimed put does."""
        if committed:
            self._hiding.forget(discard)

    def forgo(self, task_id: str, discard: Discard | None) -> GiveBack | None:
        """``task_id``'s entry was discarded, by ``discard`` (``None``: no row was left to
        mark): no take under way takes the discard's row, and no give-back makes it, nor
        a row a take under way or being given back holds for the id already, unread again
        (a row put since is another's). A take submitted later is applied after the
        discard. Returns the give-back not committed yet that holds the id, if any: it
        may have read these rows already, in a transaction still open, so the discard is
        to mark the row it gives back too."""
        if not self._taking and not self._giving:
            return None

        def held(take: TakeAll) -> list[int]:
            return [d for taken_id, d, _ in take.taken or () if taken_id == task_id]

        rows_held = [d for take in self._taking for d in held(take)]
        committed, holding = self._writer.committed, None
        for back in self._giving:
            given = held(back.of)
            rows_held.extend(given)
            if given and not 0 < back.seq <= committed:
                holding = back
        with self._lock:
            if discard is not None:
                self._forgone.add(discard)
            self._forgone_rows.update(rows_held)
        return holding

    def forgone(self) -> set[int]:
        """The rows :meth:`forgo` keeps from every take and give-back (called from the
        writer thread, inside their transactions, and on the loop)."""
        with self._lock:
            return {discard.target() for discard in self._forgone} | self._forgone_rows

    def _forget_forgone(self) -> None:
        if not self._taking and not self._giving and (self._forgone or self._forgone_rows):
            with self._lock:
                self._forgone.clear()
                self._forgone_rows.clear()

    def handed_back(self, put: Put) -> bool:
        """Whether ``put``, once taken by the writer, was handed back by a failed store
        (it will never be written)."""
        with self._lock:
            return not put.picked

    def claim_untaken(self) -> list[Put]:
        """Consume every entry the writer has not taken, in arrival order; they stay
        entries until :meth:`claimed_all` (or :meth:`unclaim`)."""
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

    def claimed_all(self, puts: list[Put]) -> None:
        """:meth:`claim_untaken`'s ``puts`` are consumed, and the rest of the entries taken
        from the database: no entry is left; ``puts`` hide their ids."""
        self._puts.clear()
        for put in puts:
            self._hiding.latest(put)

    def in_hand(self, task_id: str, delivery_id: int) -> Put | None:
        """The put here whose row is ``delivery_id``, if any. (A put in a transaction that
        rolled back and is being tried again holds its last try's ids until the writer
        applies it again.)"""
        for put in (self._durable.get(task_id), self._puts.get(task_id)):
            if put is not None and put.delivery_id == delivery_id:
                return put
        return None

    def taken_row(self, task_id: str, delivery_id: int) -> None:
        """The row ``delivery_id`` is being discarded: a put here that wrote it (a durable
        one whose commit is not reported yet) holds no entry when it is."""
        put = self.in_hand(task_id, delivery_id)
        if put is not None:
            self.taken(put)

    def taken(self, put: Put) -> None:
        """``put`` (from :meth:`in_hand`) was taken from the database by its own mailbox."""
        put.taken = True
        self.revealed(put)

    def clear(self) -> None:
        # The takes under way keep what they keep: each still takes it, or its end (took)
        # lets it be overwritten.
        for puts in (self._puts, self._durable, self._hiding):
            puts.clear()
