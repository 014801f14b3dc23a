"""The durable mailbox: a session's envelopes as delivery rows in the store.

A put is queued for the writer thread (group commit) and kept here, in ``_pending``, until
its batch commits, so this process reads its own puts at once, as the interface promises.
Other processes see a put once it commits. Three rules keep every envelope taken once:

- A pending put the writer has not taken yet is consumed here alone (``claimed``): its row
  is then written as ``read`` in the first place, and no other process ever sees it unread.
- Anything else is taken in the database, by one ``UPDATE … RETURNING`` inside
  ``BEGIN IMMEDIATE`` (``_taking``), after waiting, through the writer's gate, for the
  writer's transaction in flight: a put the writer has taken is committed by the time
  the take looks for it. ``take_all`` and ``discard`` instead have the writer take, in
  their place in a batch (``_takes``): every put before them is written by then.
- Whether the writer has taken a put is decided under the writer's lock, on both sides.

Blocking: ``put``, ``peek``, ``__len__`` and the subscriptions run a few indexed SQLite
reads on the event loop (tens of microseconds each); ``drain`` and ``drain_all`` of a
committed entry take the write lock for one short transaction (no fsync of its own: see
"Durability" in ``design/store.md``), first waiting for a write transaction in flight, any
process's, for up to ``busy_timeout``; ``take_all`` awaits the writer's commit instead,
and ``discard`` does not wait for it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel

from .._envelope import DelegateResult, encodes
from .._errors import ConfigError, MailboxFull
from .._mailbox import BaseMailbox, MailboxStatistics, Signal, report_consumed
from . import _deliveries as rows
from ._census import Census
from ._errors import StoreError
from ._in_hand import InHand
from ._pending import Pending, Put
from ._sqlite import Connection
from ._subscriptions import Subscriptions, fire
from ._takes import Discard, GiveBack, GivenRow, TakeAll
from ._taking import LoopTakes
from ._tally import Tally
from ._writer import Writer

__all__ = ["SqliteMailbox"]

logger = logging.getLogger("subagents.mailbox")
_UTF8 = "a str that encodes as UTF-8 (no lone surrogate)"
_instances = itertools.count(1)


class SqliteMailbox(BaseMailbox):
    """A session's mailbox kept in a :class:`~subagents.store.SqliteStore`.

    Made by :meth:`SqliteStore.mailbox`; it implements :class:`~subagents.BaseMailbox`
    (and passes ``check_mailbox``), shared by every process that opens the same store and
    session: a put in one is readable, waitable and consumable in all, and each envelope is
    consumed by exactly one of them. Use it from the event loop that opened the store.

    ``committed``, like ``consumed`` a hook attribute, is called on the event loop with each
    envelope this mailbox put once the transaction holding it has committed (so a caller can
    hand an envelope on only once it is durable, with no task waiting per envelope). A put
    overwritten before the writer took it is never written, and not reported (unless a
    ``take_all`` submitted between the two is to take it); one consumed
    here before it was written is written as ``read``, and reported. A hook that raises is
    logged and ignored.

    Across processes, ``capacity`` counts committed entries and this object's uncommitted
    ones. A put counts the committed ones only once the tally of the session's objects in
    this process (the last count plus their puts since) reaches ``capacity``, so objects
    putting new ids into one session may together exceed it by what the others put since
    that count. Expiry reads ``clock`` (default: unix time), so every process sharing a
    session with a TTL must use the same clock.
    """

    committed: Callable[[DelegateResult], object] | None = None

    def __init__(
        self,
        session: str,
        *,
        conn: Connection,
        writer: Writer,
        origin: str,
        watch: Callable[[SqliteMailbox, bool], object],
        wait_committed: Callable[[int], Awaitable[None]],
        capacity: int,
        ttl: float | None,
        clock: Callable[[], float],
        tally: Tally,
        recipient: str = "",
    ) -> None:
        self.session = session
        """The session id: the mailbox's key in the store."""
        self.recipient = recipient
        self.origin = f"{origin}.{next(_instances)}"
        """Who this mailbox is in the ``origin`` and ``consumer`` columns."""
        self._conn = conn
        self._writer = writer
        self._wait_committed = wait_committed
        self._capacity = capacity
        self._ttl = ttl
        self._clock = clock
        self._pending = Pending(writer, expiring=ttl is not None)
        self._in_hand = InHand(self._pending, capacity)
        self._takes = LoopTakes(
            conn,
            self._pending,
            self._in_hand,
            session=session,
            recipient=recipient,
            consumer=self.origin,
        )
        self._census = Census(
            conn, self._pending, tally, session=session, recipient=recipient, capacity=capacity
        )
        self._subs = Subscriptions(lambda active: watch(self, active))
        self._closed = False
        self._last_seq = 0
        # Bound once, not at each put: a put's callbacks live through collections on its way.
        self._as_put = (self._written, None)
        self._as_durable = (self._revealed, self._kept_here)
        self._seen = 0  # the newest delivery id looked at for other processes' puts

    @property
    def capacity(self) -> int:
        """Maximum distinct unread task ids."""
        return self._capacity

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------ reading

    def _decode(self, body: bytes) -> DelegateResult:
        return rows.decode(self._conn.path, body)

    def _find(self, task_id: str, now: float) -> bytes | None:
        session, recipient = self.session, self.recipient
        return self._conn.read(lambda raw: rows.find(raw, session, recipient, task_id, now))

    def peek(self, task_id: str) -> DelegateResult | None:
        if self._closed:
            return None
        now = self._clock()
        known, envelope = self._pending.answer(task_id, now)
        if known:
            return envelope
        body = self._find(task_id, now)
        return None if body is None else self._decode(body)

    def __len__(self) -> int:
        return 0 if self._closed else self._census.count(self._clock())

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(
            entries=len(self),
            capacity=self._capacity,
            task_subscribers=self._subs.task_count,
            all_subscribers=self._subs.all_count,
            closed=self._closed,
        )

    # ------------------------------------------------------------ putting

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        """Store ``envelope`` under ``task_id``: readable here at once, committed by the
        writer thread soon after (:meth:`wait_committed`), then readable everywhere.

        Raises:
            MailboxFull: see :meth:`BaseMailbox.put`.
            ConfigError: ``task_id`` does not encode as UTF-8.
            StoreError: the store failed earlier and takes no more writes.
        """
        put = self._submit(task_id, envelope, False)
        if put is None:
            return False
        self._pending.add(put)  # after the submit: a refused one replaces nothing
        self._subs.fire_arrived((task_id,))
        return True

    def put_durable(self, task_id: str, envelope: DelegateResult) -> bool:
        """Store ``envelope`` under ``task_id``, readable (here and everywhere) only once the
        transaction holding it has committed; its subscribers are signalled then. If the
        store fails first, it becomes readable in this process as :meth:`put`'s are.

        Capacity counts these puts from the moment they are accepted, like :meth:`put`'s:
        exact within a process.

        Raises:
            MailboxFull: see :meth:`BaseMailbox.put`.
            ConfigError: ``task_id`` does not encode as UTF-8.
            StoreError: the store failed earlier and takes no more writes.
        """
        put = self._submit(task_id, envelope, True)
        if put is None:
            return False
        self._pending.add_durable(put)
        return True

    def _submit(self, task_id: str, envelope: DelegateResult, durable: bool) -> Put | None:
        """Check capacity and queue the put's write; ``None`` once dropped."""
        if self._closed:
            return None
        if not encodes(task_id):  # SQLite stores UTF-8: refused here, not in the writer
            raise ConfigError("task_id", _UTF8, task_id)
        now = self._clock()
        if (
            self._census.full(now)
            and not self._pending.holds(task_id)  # else it replaces one in hand
            and (self._pending.hides(task_id) or self._find(task_id, now) is None)  # new id
        ):
            raise MailboxFull(self._capacity, task_id)
        on_written, on_failed = self._as_durable if durable else self._as_put
        put = Put(
            session=self.session,
            recipient=self.recipient,
            origin=self.origin,
            task_id=task_id,
            envelope=envelope,
            stored_at=now,
            expires_at=None if self._ttl is None else now + self._ttl,
            on_written=on_written,
            on_failed=on_failed,
        )
        self._last_seq = self._writer.submit(put)
        self._census.accepted()
        return put

    def _written(self, put: Put) -> None:
        """The writer committed ``put``: from now on the database has it."""
        self._pending.discard(put)
        self._hold(put)
        self._report_committed(put)

    def _hold(self, put: Put) -> None:
        if not self._closed:
            self._in_hand.hold(put)

    def _revealed(self, put: Put) -> None:
        """The writer committed a :meth:`put_durable`: it is readable from now on."""
        self._pending.revealed(put)
        self._hold(put)
        if not self._closed and not put.taken:  # a taken one holds no entry
            self._subs.fire_arrived((put.task_id,))
        self._report_committed(put)

    def _kept_here(self, put: Put) -> None:
        """The store failed before committing a :meth:`put_durable`: it is readable in this
        process alone, from memory, as an uncommitted :meth:`put` is."""
        if not self._pending.keep(put):  # a later put of its id came since, or dropped
            return
        self._subs.fire_arrived((put.task_id,))

    def _report_committed(self, put: Put) -> None:
        hook = self.committed
        if hook is not None:
            try:
                hook(put.envelope)
            except Exception:
                logger.exception("mailbox committed hook %r raised; ignored", hook)

    async def wait_committed(self) -> None:
        """Block until every put this mailbox accepted so far, and every :meth:`discard`,
        is committed (durable as the store's ``synchronous`` setting makes commits).

        Cancellation stops the wait, not the writes. Returns at once if nothing is pending.

        Raises:
            StoreError: the store failed before committing them.
        """
        await self._wait_committed(self._last_seq)

    # ------------------------------------------------------------ consuming

    def drain(self, task_id: str) -> DelegateResult | None:
        if self._closed:
            return None
        now = self._clock()
        put, decided = self._takes.here(task_id, now)
        if decided:
            return None if put is None else report_consumed(self, [put.envelope])[0]
        envelope = self._takes.one(task_id, put, now)
        return None if envelope is None else report_consumed(self, [envelope])[0]

    def discard(self, task_id: str) -> None:
        """Consume ``task_id``'s entry, if it has one, for nobody (``consumed`` is not
        called), without waiting for the database: from the call on no read here sees it
        and no ``take_all`` of this object takes it (but one already in its transaction),
        and its row, that one row, is marked read in the writer's next transaction (a put
        the writer has not taken yet is written as ``read`` instead). Until that commits,
        another process may still take the row, and a process killed meanwhile delivers
        it again after its restart. :meth:`wait_committed` waits for it too. A store that
        has failed or is closing drains it instead (see :meth:`drain`).
        """
        if self._closed:
            return
        now = self._clock()
        put, decided = self._takes.here(task_id, now)
        if decided:
            return
        target: Put | GivenRow | int | None = put
        if target is None:  # the id's row, if it has one, is the database's
            target = self._takes.row(task_id, now)
            if target:
                self._pending.taken_row(task_id, target)  # a durable put's, its report to come
            else:  # one a cancelled take took stays read, and the row given back is marked
                back = self._pending.forgo(task_id, None)
                if back is None:
                    return
                target = back.row_of(task_id)
        discard = Discard(task_id, self.origin, now, self._discarded, target)
        try:
            self._last_seq = self._writer.submit(discard)
        except (StoreError, anyio.ClosedResourceError):  # as drain answers then
            self.drain(task_id)
            return
        self._pending.discarding(discard)
        self._pending.forgo(task_id, discard)

    def _discarded(self, discard: Discard, committed: bool) -> None:
        self._pending.discarded(discard, committed)
        self._in_hand.let_go(discard.target())
        task_id = discard.task_id
        # A later row of the id (another process's put) is an entry from now on, and a
        # commit that changed nothing does not wake the watcher: its waiters hear it here.
        if committed and not self._closed and self._subs.waits(task_id) and self._present(task_id):
            self._subs.fire_tasks((task_id,))
        if not committed:
            logger.warning(
                "the store failed before marking %r read in session %r: it stays unread "
                "in the file, and consumed here",
                discard.task_id,
                self.session,
            )

    def drain_all(self) -> list[DelegateResult]:
        if self._closed:
            return []
        return report_consumed(self, self._takes.all(self._clock()))

    async def take_all(self) -> list[DelegateResult]:
        """:meth:`drain_all` without blocking the event loop: a write in the writer's next
        transaction (``_takes``), awaited, instead of a transaction of the loop's own
        behind the writer's. It takes what a ``drain_all`` at the call would have, and
        what other processes commit before it is applied. Cancelled before the writer
        takes it, it takes nothing; after, by an anyio or trio scope, it returns what it
        took (the scope raises at the next checkpoint); by asyncio's own cancellation, it
        raises and gives what it took back, unread. A store that failed first leaves it
        to :meth:`drain_all`."""
        if self._closed:
            await anyio.lowlevel.checkpoint()
            return []
        take = TakeAll(
            self.session,
            self.recipient,
            self.origin,
            self._clock(),
            self._in_hand.find,
            self._pending.forgone,
        )
        self._writer.defer_stop()  # a give-back may follow the take's commit
        try:
            take.submit(self._writer)
            self._pending.taking(take)
            taken = await take.committed(self._writer, self._giving_back)
        except (StoreError, anyio.ClosedResourceError):  # as drain_all answers then
            taken = None
        finally:
            self._pending.took(take)
            self._writer.allow_stop()
        if taken is None:  # the store failed, or failed before committing it
            return self.drain_all()
        return report_consumed(self, self._in_hand.handed(taken, self._decode))

    def _giving_back(self, take: TakeAll) -> GiveBack:
        return self._pending.giving(GiveBack(take, self._given_back))

    def _given_back(self, back: GiveBack, task_ids: list[str]) -> None:
        self._pending.given(back)
        if task_ids and not self._closed:
            self._census.stale()  # entries arrived that no put counted
            self._subs.fire_arrived(task_ids)

    # ------------------------------------------------------------ subscriptions and drop

    def _present(self, task_id: str) -> bool:
        """Whether ``task_id`` has a live entry (``peek`` without decoding it)."""
        now = self._clock()
        known, envelope = self._pending.answer(task_id, now)
        if known:
            return envelope is not None
        return self._find(task_id, now) is not None

    def subscribe_once(self, task_id: str, callback: Signal) -> str | None:
        if self._closed or self._present(task_id):
            fire((callback,))
            return None
        return self._subs.add_once(task_id, callback)

    def subscribe_all(self, callback: Signal) -> str:
        if self._closed:
            fire((callback,))  # the drop signal, as subscribe_once gives it
            return self._subs.new_id()
        if not self._subs.all_count:  # signal other processes' puts from now on
            self._seen = self._conn.read(rows.last_id)
        return self._subs.add_all(callback)

    def unsubscribe(self, subscription_id: str | None) -> None:
        self._subs.remove(subscription_id)

    def _look_again(self) -> None:
        """The database changed (another connection committed): fire the subscriptions
        whose entries arrived, and the all-puts ones if another mailbox put."""
        if self._closed:
            return
        session, recipient, origin = self.session, self.recipient, self.origin
        task_ids = self._subs.task_ids()
        if task_ids:
            now = self._clock()
            arrived = self._conn.read(
                lambda raw: rows.live_among(raw, session, recipient, task_ids, now)
            )
            self._subs.fire_tasks(arrived)
        if self._subs.all_count:
            after = self._seen
            self._seen, foreign = self._conn.read(
                lambda raw: rows.puts_since(raw, session, recipient, after, origin)
            )
            if foreign:
                self._census.stale()
                self._subs.fire_all()

    def drop(self) -> None:
        """Release this mailbox object: later calls see it closed and its waiters wake with
        ``None``. The rows stay: other processes may share the session, and puts already
        accepted still commit."""
        if self._closed:
            return
        self._closed = True
        self._pending.clear()
        self._in_hand.clear()
        self._subs.fire_drop()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._pending)} pending"
        return f"<SqliteMailbox {self.session!r} {state}>"
