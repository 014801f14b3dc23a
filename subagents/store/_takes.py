"""A mailbox's takes as writes of the writer thread's batch: of every unread envelope
(:class:`TakeAll`, and :class:`GiveBack` of what a cancelled one took), and of one id's
entry for nobody (:class:`Discard`).

``SqliteMailbox.take_all`` submits a :class:`TakeAll` instead of opening a transaction of
its own on the event loop's connection. The event loop's take must first wait, blocked,
for the writer's transaction in flight (the gate): in a fan-out on the store that was a
sixth of the loop's time, the loop idle while the writer worked. Applied in its place in
the writer's batch (it has no order, so nothing moves across it), the take sees every put
submitted before it, committed with it or earlier, and none submitted after; other
processes' rows it sees as any transaction does.

The take leaves its transaction with every envelope it took: those the mailbox holds in
memory (``InHand.find``) as the objects put, the others' bodies read in the same
transaction. So once committed it needs nothing more of the database: a connection closed
meanwhile, a task forgotten, or an envelope let go of in memory cannot lose a row it
marked read.

Until the writer takes it into a transaction, a take can be withdrawn: its caller's
cancellation then lands at once, nothing taken. Once taken (the write lock held, so the
transaction ends within its own statements and commit), the caller waits for the commit
and then, cancelled by an anyio or trio scope, gets what it took (the scope raises again
at every checkpoint); cancelled by asyncio's own ``task.cancel()``, which is raised once
and may end the task before any checkpoint, it raises at once and gives what it took back
(:class:`GiveBack`): a task that ends without its result would lose it.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Callable, Sequence
from typing import Protocol, Self

import anyio

from .._envelope import DelegateResult, now_ms
from . import _deliveries as rows
from ._errors import StoreError
from ._writer import Write, Writer

__all__ = ["Discard", "Found", "GiveBack", "GivenRow", "TakeAll", "Taken"]

logger = logging.getLogger("subagents.store")

Found = Callable[[str, int, int], "DelegateResult | None"]
"""``found(task_id, delivery_id, take_seq)``: the envelope of that row if the mailbox
holds it, asked by the take of sequence number ``take_seq``."""

Taken = tuple[str, int, "DelegateResult | bytes"]
"""A taken entry: ``(task_id, delivery_id, envelope or its row's body)``, in arrival order."""


class TakeAll(Write):
    """Take every live entry of one mailbox (past their TTL at ``now``: expired)."""

    __slots__ = (
        "_done",
        "consumer",
        "forgone",
        "found",
        "now",
        "picked",
        "recipient",
        "session",
        "taken",
        "withdrawn",
    )

    def __init__(
        self,
        session: str,
        recipient: str,
        consumer: str,
        now: float,
        found: Found,
        forgone: Callable[[], set[int]],
    ) -> None:
        super().__init__()
        self.session = session
        self.recipient = recipient
        self.consumer = consumer
        self.now = now
        self.found = found
        """Called in the writer thread: it only looks (see ``InHand.find``)."""
        self.forgone = forgone
        """Called in the writer thread, by this take and by its give-back: the rows its
        mailbox's discards consumed (``Pending.forgone``), which neither takes."""
        self._done = anyio.Event()
        self.picked = False
        self.withdrawn = False
        self.taken: list[Taken] | None = None
        """The entries taken, once applied; ``None`` if the store failed first."""

    def submit(self, writer: Writer) -> int:
        """Queue this take; its sequence number.

        Raises:
            StoreError: the store failed earlier (nothing submitted).
            anyio.ClosedResourceError: the store is closing.
        """
        return writer.submit(self)

    async def committed(
        self, writer: Writer, giving_back: Callable[[TakeAll], GiveBack]
    ) -> list[Taken] | None:
        """Wait for this take's commit: the entries it took, or ``None`` if the store
        failed first. Cancelled before the writer takes it, it is withdrawn and the
        cancellation raised. After, the wait goes on (the transaction holds the write
        lock, so it is short); then a cancelled anyio or trio scope gets what it took (the
        scope raises again at the caller's next checkpoint), while asyncio's own
        cancellation, raised once, is raised now and what was taken is given back: the
        :class:`GiveBack` that ``giving_back`` makes is submitted (the caller keeps the
        writer from stopping until this returns)."""
        try:
            await self._done.wait()
        except anyio.get_cancelled_exc_class():
            with writer.lock:
                self.withdrawn = not self.picked
            if self.withdrawn:
                raise
            # No anyio scope is cancelled: asyncio's own cancellation, which may end the
            # task before its next checkpoint, with whatever it returned dropped.
            back = giving_back(self) if anyio.current_effective_deadline() > -math.inf else None
            try:
                await self._commit_whatever_cancels()
            finally:
                if back is not None:  # also when an interrupt ends the wait
                    back.submit(writer)
            if back is None:
                return self.taken  # a cancelled scope: it raises at the next checkpoint
            raise
        return self.taken

    async def _commit_whatever_cancels(self) -> None:
        """Wait for the commit of a take the writer has taken, shielded; asyncio's own
        cancellation, which no shield holds back, is waited through too."""
        while not self._done.is_set():
            try:
                with anyio.CancelScope(shield=True):
                    await self._done.wait()
            except anyio.get_cancelled_exc_class():
                continue

    def take(self) -> bool:
        if self.withdrawn:
            return False
        self.picked = True
        return True

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        for w in writes:
            claimed = rows.claim_ids(
                conn,
                w.session,
                w.recipient,
                consumer=w.consumer,
                now=w.now,
                ms=now_ms(),
                skipping=list(w.forgone()),
            )
            here = {
                d: e for task_id, d, _ in claimed if (e := w.found(task_id, d, w.seq)) is not None
            }
            found = rows.bodies(conn, [e for _, d, e in claimed if d not in here])
            # Every claimed row has its envelope row: both are in this one transaction.
            w.taken = [
                (task_id, d, here[d] if d in here else found[e]) for task_id, d, e in claimed
            ]

    def release(self) -> None:
        self.taken = None  # rolled back: nothing was taken

    def done(self) -> None:
        self._done.set()

    def failed(self) -> None:
        self._done.set()


class GiveBack(Write):
    """What a committed take took, given back because its caller is gone (cancelled by
    asyncio's own ``task.cancel()``): each row unread again unless overwritten meanwhile.
    Made as the caller is cancelled; from the take's apply to its own commit, the mailbox
    counts the take's ids as entries (``Pending.giving``): to its reads the rows are read,
    or about to be."""

    __slots__ = ("_ended", "given", "of")

    def __init__(self, of: TakeAll, ended: Callable[[GiveBack, list[str]], object]) -> None:
        super().__init__()
        self.of = of
        self._ended = ended
        self.given: dict[str, int] = {}
        """The new row of each id given back, once applied (read from the writer thread by
        a discard of the id applied after it: :meth:`row_of`)."""

    def row_of(self, task_id: str) -> GivenRow:
        """The row this gives back for ``task_id``, as a discard's target."""
        return GivenRow(self, task_id)

    def count(self) -> int:
        """The rows it is to give back (none until the take is applied)."""
        return len(self.of.taken or ())

    def submit(self, writer: Writer) -> None:
        """Queue it; a store that has failed loses the rows (logged)."""
        if not self.count():
            self._ended(self, [])
            return
        try:
            writer.submit(self)
        except (StoreError, anyio.ClosedResourceError) as exc:
            self._lost(exc)

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        for w in writes:
            taken = w.of.taken or ()
            # A row discarded since the take was asked is left read: its caller has it.
            forgone = w.of.forgone()
            rows_taken = [d for _, d, _ in taken if d not in forgone]
            w.given = dict(rows.give_back(conn, rows_taken, w.of.consumer, now_ms()))

    def release(self) -> None:
        self.given = {}

    def done(self) -> None:
        self._ended(self, list(self.given))

    def failed(self) -> None:
        self._lost(None)

    def _lost(self, exc: BaseException | None) -> None:
        logger.error(
            "a cancelled take's %d envelopes could not be given back: the store %s; they "
            "stay read in the store",
            self.count(),
            "failed" if exc is None else f"refused it ({exc})",
        )
        self._ended(self, [])


class GivenRow:
    """A give-back's new row of one id, known once the give-back is applied (0 before)."""

    __slots__ = ("_back", "_task_id")

    def __init__(self, back: GiveBack, task_id: str) -> None:
        self._back = back
        self._task_id = task_id

    @property
    def delivery_id(self) -> int:
        return self._back.given.get(self._task_id, 0)


class _Written(Protocol):
    @property
    def delivery_id(self) -> int: ...


class Discard(Write):
    """Mark one entry's delivery row read for nobody (``SqliteMailbox.discard``: its
    caller has the envelope): the row ``of`` names, a delivery id read at the call, or
    the row of a write applied a batch earlier (a put the writer has taken, a give-back),
    whose id is known by the time this one is applied. The one row, so a put of the id
    submitted after it, here or in another process, is not touched. Until it commits the
    mailbox takes the id for no entry and its takes leave the row alone
    (``Pending.discarding``, ``Pending.forgo``). An entry past its TTL becomes
    ``expired``."""

    __slots__ = ("_ended", "consumer", "now", "of", "task_id")

    def __init__(
        self,
        task_id: str,
        consumer: str,
        now: float,
        ended: Callable[[Discard, bool], object],
        of: _Written | int,
    ) -> None:
        super().__init__()
        self.task_id = task_id
        self.consumer = consumer
        self.now = now
        self._ended = ended
        """Called on the event loop with whether it committed."""
        self.of = of

    def target(self) -> int:
        """The delivery row it marks read (0 while the write it names is not applied)."""
        return self.of if isinstance(self.of, int) else self.of.delivery_id

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        rows.mark_read(conn, [(w.target(), w.consumer, w.now) for w in writes], now_ms())

    def done(self) -> None:
        self._ended(self, True)

    def failed(self) -> None:
        self._ended(self, False)
