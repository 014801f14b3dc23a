"""The writer thread: group commit of every pending write, one callback per batch.

Callers on the event loop :meth:`Writer.submit` writes (never waiting for the thread: a
lock held for a deque append, and now and then a pause that lets the thread take the GIL).
The thread takes every write pending when its transaction opens (up to ``max_batch``) into
one ``BEGIN IMMEDIATE`` transaction, commits, hands the batch's callback to the
:class:`~._courier.Courier` (which calls into the event loop without the writer waiting
for it) and goes on. It opens its next transaction once that callback has run, or at once
if ``eager_batch`` writes are queued by then, or ``linger`` seconds after its last commit
(and, with a ``commit_delay``, never sooner than that after it unless ``eager_batch``
writes are queued): so while the event loop is busy (a fan-out running its children back
to back) the writer commits alongside it in batches of a useful size, while it is idle
each commit's writes are handed on before the next begins, and a loop that does not come
back (a runner blocking it, or the loop ended) holds no write back for longer than
``linger``. Committing whatever is queued as soon as possible would instead make batches
of a few writes, each with its own commit, whose Python steps fight the event loop for the
GIL at every statement.

A batch is a prefix of what was submitted, so "every write up to sequence number n is
committed" is one number (the watermark). Inside its transaction the writes are applied
in submission order, but for those whose class gives them an :meth:`Write.order`: between
two writes without one, they are applied class by class in increasing order (each class's
in submission order), so that each class runs its statements once for the lot, as a raw
``executemany`` loop would, instead of once for each of the interleaved runs a fan-out
submits (a child's start, its put, its end, the next child's start, ...).

A busy database is retried for as long as it stays busy (the writes must not be lost; a
warning is logged every ``busy_timeout``). Any other SQLite error (disk full, I/O error,
corruption) fails the store: the pending writes are handed back (:meth:`Write.release`)
and every later :meth:`Writer.submit` raises :class:`StoreError`.
"""

from __future__ import annotations

import itertools
import logging
import math
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar, Final, Self

import anyio
from anyio.lowlevel import EventLoopToken

from ._courier import Courier
from ._errors import StoreError
from ._sqlite import immediate, retrying

__all__ = ["DEFAULT_MAX_BATCH", "OnBatch", "Write", "Writer"]

logger = logging.getLogger("subagents.store")

DEFAULT_MAX_BATCH: Final = 1024
DEFAULT_EAGER_BATCH: Final = 256
DEFAULT_LINGER: Final = 0.005
_GIL_HANDOFF: Final = 20e-6
"""Seconds ``Writer._make_way`` asks to keep the submitting thread off the GIL (about 100 µs
on Linux, whose timer slack is 50 µs)."""
_HANDOFF_EVERY: Final = 64
"""Writes submitted between two chances for the store's threads to take the GIL."""
_pause = time.sleep  # the pause itself, by its own name (a test counts them)
_LONGEST_WAIT: Final = 3600.0
"""Seconds the thread waits at most before it looks at its queue again."""


class Write:
    """One write for the writer thread. ``seq`` is set by :meth:`Writer.submit`.

    :meth:`take` and :meth:`release` run in the writer thread under :attr:`Writer.lock`,
    :meth:`apply` (once for each run of consecutive writes of one class) inside the
    batch's transaction, :meth:`done` on the event loop once the batch is committed, or
    :meth:`failed` there once the store has failed before committing it.
    """

    __slots__ = ("seq",)

    ORDER: ClassVar[int | None] = None
    """What :meth:`order` answers unless a class says otherwise."""

    def __init__(self) -> None:
        self.seq = 0

    def order(self) -> int | None:
        """``None``: applied in its place, after every write submitted before it and before
        every one after it. A number: between two writes that answer ``None``, applied
        with its class's writes, the classes in increasing order. So a class with an order
        must commute with every write of a lower order submitted after it: swapping the
        two leaves the database as applying them in submission order would."""
        return self.ORDER

    def take(self) -> bool:
        """The writer takes this write into a batch; ``False`` skips it (superseded)."""
        return True

    def release(self) -> None:
        """The store failed before this write was committed; it never will be."""

    def failed(self) -> None:
        """On the event loop, after :meth:`release`: the store failed first."""

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        """Execute the statements of ``writes``, consecutive writes of this class in
        submission order, inside the batch's transaction (``executemany`` where it can)."""
        raise NotImplementedError

    def done(self) -> None:
        """On the event loop, after the commit."""


def _kind(write: Write) -> type[Write]:
    return type(write)


def _runs(batch: list[Write]) -> Iterator[tuple[type[Write], list[Write]]]:
    """``batch`` as the runs its classes apply, in the order :meth:`Write.order` allows."""
    movable: list[tuple[int, Write]] = []  # since the last write that keeps its place
    fixed: list[Write] = []  # consecutive writes of one class that keep their places
    for write in batch:
        order = write.order()
        if order is not None:
            if fixed:
                yield type(fixed[0]), fixed
                fixed = []
            movable.append((order, write))
            continue
        yield from _by_class(movable)
        movable = []
        if fixed and type(fixed[0]) is not type(write):
            yield type(fixed[0]), fixed
            fixed = []
        fixed.append(write)
    if fixed:
        yield type(fixed[0]), fixed
    yield from _by_class(movable)


def _by_class(movable: list[tuple[int, Write]]) -> Iterator[tuple[type[Write], list[Write]]]:
    movable.sort(key=_first)  # stable: each class's writes stay in submission order
    writes = [write for _, write in movable]
    for kind, run in itertools.groupby(writes, _kind):
        yield kind, list(run)


def _first(pair: tuple[int, Write]) -> int:
    return pair[0]


OnBatch = Callable[[list[Write], int, "StoreError | None"], object]
"""``on_batch(writes, watermark, failure)``: runs on the event loop after each batch; every
write with ``seq <= watermark`` is committed (``failure is None``) or never will be."""


class Writer:
    """The store's one writer thread and its queue."""

    def __init__(
        self,
        raw: sqlite3.Connection,
        *,
        path: str,
        busy_timeout: float,
        token: EventLoopToken,
        on_batch: OnBatch,
        on_stopped: Callable[[], object],
        prepare: Callable[[list[Write]], object] | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        eager_batch: int = DEFAULT_EAGER_BATCH,
        linger: float = DEFAULT_LINGER,
        commit_delay: float = 0.0,
    ) -> None:
        self._raw = raw
        self._path = path
        self._busy_timeout = busy_timeout
        self._courier = Courier(token, name="subagents-store-courier", on_lost=self._loop_lost)
        self._on_batch = on_batch
        self._on_stopped = on_stopped
        self._prepare = prepare
        self._max_batch = max_batch
        self._eager_batch = eager_batch
        self._linger = linger
        self._commit_delay = commit_delay
        self.lock = threading.Lock()
        """Guards the queue and what :meth:`Write.take` decides (held for microseconds)."""
        self.gate = threading.Lock()
        """Held by the thread around each transaction; see :class:`._sqlite.Connection`."""
        self._wake = threading.Condition(self.lock)
        self._queue: deque[Write] = deque()
        self._batch: list[Write] = []  # taken into the transaction in flight
        # Whether the thread may want the GIL now: it was woken, or is working (a hint,
        # read without the lock), and when its timed wait runs out.
        self._working = False
        self._wait_ends = math.inf
        self._seq = 0
        self.committed = 0
        """The watermark of the last batch committed: set before the gate is released, so
        a write through the gate, or a read after one, sees it (its callback may still be
        on its way to the event loop)."""
        self._unseen = 0  # batches committed whose callback has not run yet
        self._committed_at = -math.inf  # time.monotonic() of the last commit (none yet)
        self._want = 0  # queued writes that wake the waiting thread (0: it is not waiting)
        self._stopping = False
        self._stop_asked = False
        self._stop_deferred = 0  # callers that may submit once a write of theirs commits
        self.failure: StoreError | None = None
        self.batches = 0
        self.writes = 0
        self.largest_batch = 0
        self._thread = threading.Thread(target=self._run, name="subagents-store-writer")
        self._thread.daemon = True  # an unclosed store must not hang interpreter exit

    def start(self) -> None:
        self._courier.start()
        self._thread.start()

    @property
    def trips(self) -> int:
        """Calls into the event loop so far (each carrying the batches committed by then)."""
        return self._courier.trips

    @property
    def queued(self) -> int:
        """Writes submitted and not yet taken into a batch."""
        return len(self._queue)

    @property
    def submitted(self) -> int:
        """The sequence number of the last write submitted."""
        return self._seq

    def _make_way(self) -> None:
        """Called by :meth:`submit` every :data:`_HANDOFF_EVERY` writes: while the thread
        may want the GIL (it was woken, it is working, its wait has run out, or a full
        batch is queued) or the courier has callbacks to carry, step off the GIL for
        :data:`_GIL_HANDOFF` seconds so that this store's threads take it.

        Each ``sqlite3`` call releases the GIL and takes it back when SQLite returns. A
        thread waiting for the GIL asks its holder to drop it only after a whole switch
        interval without being woken, and each moment the holder releases it (an event
        loop's poll with no timeout, at every checkpoint) wakes the waiter and starts
        that interval over. So an event loop busy with Python that only releases the GIL
        for moments can keep the writer from its next statement for as long as it stays
        busy, and then wait, idle, for the commits it ran ahead of
        (``tests/store/busy_worker.py`` shows it). A real pause hands the GIL over, at a
        rate that follows the writes the loop makes."""
        if (
            self._working
            or len(self._queue) >= self._eager_batch
            or time.monotonic() >= self._wait_ends
            or self._courier.carrying
        ):
            _pause(_GIL_HANDOFF)

    def submit(self, write: Write) -> int:
        """Queue ``write``; returns its sequence number. Never waits for the writer (one
        call in :data:`_HANDOFF_EVERY` may pause for :data:`_GIL_HANDOFF` seconds).

        Raises:
            StoreError: the store failed earlier (the write is not queued).
            anyio.ClosedResourceError: the store is closing.
        """
        with self.lock:
            if self.failure is not None:
                raise StoreError(
                    self._path,
                    self.failure.reason,
                    f"an earlier write failed: {self.failure.detail}",
                )
            if self._stopping:
                raise anyio.ClosedResourceError("the store is closed")
            self._seq += 1
            seq = write.seq = self._seq
            self._queue.append(write)
            if self._want and len(self._queue) >= self._want:
                self._rouse()
        if not seq % _HANDOFF_EVERY:
            self._make_way()
        return seq

    def stop(self) -> None:
        """Commit what is queued, then end the thread (``on_stopped`` runs on the loop);
        while a :meth:`defer_stop` is in force, writes are still accepted until it ends."""
        with self.lock:
            self._stop_asked = True
            if not self._stop_deferred:
                self._stopping = True
                self._rouse()

    def defer_stop(self) -> None:
        """A caller may submit again once a write of its own commits (a take that may give
        back what it took): :meth:`stop` takes effect only after :meth:`allow_stop`."""
        with self.lock:
            self._stop_deferred += 1

    def allow_stop(self) -> None:
        with self.lock:
            self._stop_deferred -= 1
            if self._stop_asked and not self._stop_deferred:
                self._stopping = True
                self._rouse()

    def _rouse(self) -> None:
        """Wake the thread if it waits (with the lock held): from now on it may want the
        GIL, so :meth:`_make_way` pauses for it."""
        self._want = 0
        self._working = True
        self._wake.notify()

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                if not self._commit_batch():
                    break
        except BaseException:  # a bug: say so, never die silently with writes queued
            logger.exception("the store's writer thread crashed")
            failure = StoreError(self._path, "failed", "the writer thread crashed")
            # The batch in hand is handed back too: each write's failed() must run, or
            # whoever waits for its commit waits forever.
            self._courier.send(self._on_batch, self._fail(failure, self._batch), self._seq, failure)
        finally:
            try:
                self._raw.close()
            except sqlite3.Error:
                logger.exception("closing the writer's connection failed")
            self._courier.send(self._on_stopped)  # after every batch's callback
            self._courier.stop()

    def _wait_for_work(self) -> bool:
        """Wait until the next transaction should open (see the module docstring); False
        once stopping with nothing queued."""
        with self.lock:
            while not self._stopping:
                if not self._queue:
                    self._want = 1
                    self._working, self._wait_ends = False, math.inf
                    self._wake.wait()
                    continue
                if len(self._queue) >= self._eager_batch:
                    break
                # The delay holds in any case; an unseen callback is waited for up to
                # the linger (its running wakes this wait, which then looks again).
                pause = (
                    max(self._commit_delay, self._linger) if self._unseen else self._commit_delay
                )
                left = self._committed_at + pause - time.monotonic()
                if left <= 0:
                    break
                self._want = self._eager_batch
                # Capped: a delay beyond what a thread can wait for is looked at again.
                wait = min(left, _LONGEST_WAIT)
                self._working, self._wait_ends = False, time.monotonic() + wait
                self._wake.wait(wait)
            self._want = 0
            self._working, self._wait_ends = True, math.inf
            return bool(self._queue)

    def _loop_lost(self) -> None:
        """The courier lost a trip (or the event loop has ended): the callbacks it carried
        will never run, so the thread must not wait for them."""
        with self.lock:
            self._unseen = 0
            self._rouse()

    def _take(self, batch: list[Write]) -> int:
        """Move up to ``max_batch`` queued writes into ``batch``; returns the watermark."""
        watermark = 0
        with self.lock:
            queue = self._queue
            for _ in range(min(len(queue), self._max_batch)):
                write = queue.popleft()
                watermark = write.seq
                if write.take():
                    batch.append(write)
        return watermark

    def _commit_batch(self) -> bool:
        """One transaction, then the batch's callback handed to the courier; False when
        the store failed."""
        raw = self._raw
        batch: list[Write] = []
        self._batch = batch
        watermark = 0

        def attempt() -> None:
            nonlocal watermark
            with immediate(raw):
                if not watermark:  # taken once the lock is held; a retry keeps the batch
                    watermark = self._take(batch)
                    if self._prepare is not None:
                        self._prepare(batch)
                for kind, writes in _runs(batch):
                    kind.apply(raw, writes)
            self.committed = watermark

        failure, lost = self._commit_under_gate(attempt, batch)
        if failure is not None:
            self._courier.send(self._on_batch, lost, self._seq, failure)
            return False
        self._batch = []
        self.batches += 1
        self.writes += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        with self.lock:
            self._committed_at = time.monotonic()
            if self._courier.reaches_loop:
                self._unseen += 1
        self._courier.send(self._seen, batch, watermark)
        return True

    def _seen(self, batch: list[Write], watermark: int) -> None:
        """On the event loop: a committed batch's callback; the thread may go on."""
        try:
            self._on_batch(batch, watermark, None)
        finally:
            with self.lock:
                self._unseen = max(0, self._unseen - 1)
                if self._want and self._queue:  # with none queued, it waits for a put
                    self._rouse()

    def _commit_under_gate(
        self, attempt: Callable[[], None], batch: list[Write]
    ) -> tuple[StoreError | None, list[Write]]:
        """Run ``attempt`` (one transaction) holding the gate, retrying while the database
        is locked: ``(None, [])`` once committed, else the error that ends the store and
        the writes it lost (refused while the gate is still held)."""
        held = False
        try:
            while True:
                if not held:
                    held = self.gate.acquire(timeout=self._busy_timeout)  # a take has it
                    if not held:
                        continue
                try:
                    retrying(attempt, path=self._path, timeout=self._busy_timeout)
                    return None, []
                except StoreError as exc:
                    if exc.reason != "locked":
                        return exc, self._fail(exc, batch)
                    logger.warning("%s; still retrying %d writes", exc, self.queued + len(batch))
                except Exception:  # a bug: the batch goes back before a take sees the gate free
                    logger.exception("the store's writer thread crashed")
                    crash = StoreError(self._path, "failed", "the writer thread crashed")
                    return crash, self._fail(crash, batch)
                if not batch:
                    # Nothing taken yet: free the gate between tries, so that a take on the
                    # event loop may try too (a taker must never see a taken write that is
                    # not committed, so with writes taken the gate stays held).
                    self.gate.release()
                    held = False
        finally:
            if held:
                self.gate.release()

    def _fail(self, failure: StoreError, batch: list[Write]) -> list[Write]:
        """Refuse all further writes and hand back the batch and the queue."""
        logger.error("%s; the store accepts no more writes", failure)
        with self.lock:
            self.failure = failure
            lost = [*batch, *self._queue]
            self._queue.clear()
            for write in lost:
                write.release()
        return lost

    def join(self, timeout: float | None) -> bool:
        """Wait for the thread (blocking); True if it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
