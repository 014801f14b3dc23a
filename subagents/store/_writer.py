"""The writer thread: group commit of every pending write, one event-loop wake-up per batch.

Callers on the event loop :meth:`Writer.submit` writes (never blocking: a lock held for a
deque append). The thread takes every write pending when its transaction opens (up to
``max_batch``) into one ``BEGIN IMMEDIATE`` transaction, commits, then calls back into the
event loop once for the whole batch (``anyio.from_thread.run_sync`` with the loop's token,
which works on asyncio and trio alike). While it waits for that call, new writes pile up
for the next batch: the slower the commits, the larger the batches.

Writes are applied in submission order, and a batch is a prefix of what was submitted, so
"every write up to sequence number n is committed" is one number (the watermark).

A busy database is retried for as long as it stays busy (the writes must not be lost; a
warning is logged every ``busy_timeout``). Any other SQLite error (disk full, I/O error,
corruption) fails the store: the pending writes are handed back (:meth:`Write.release`)
and every later :meth:`Writer.submit` raises :class:`StoreError`.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, Self

import anyio.from_thread
from anyio.lowlevel import EventLoopToken

from ._errors import StoreError
from ._sqlite import immediate, retrying

__all__ = ["DEFAULT_MAX_BATCH", "OnBatch", "Write", "Writer"]

logger = logging.getLogger("subagents.store")

DEFAULT_MAX_BATCH: Final = 1024


class Write:
    """One write for the writer thread. ``seq`` is set by :meth:`Writer.submit`.

    :meth:`take` and :meth:`release` run in the writer thread under :attr:`Writer.lock`,
    :meth:`apply` (once for each run of consecutive writes of one class) inside the
    batch's transaction, :meth:`done` on the event loop once the batch is committed, or
    :meth:`failed` there once the store has failed before committing it.
    """

    __slots__ = ("seq",)

    def __init__(self) -> None:
        self.seq = 0

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
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self._raw = raw
        self._path = path
        self._busy_timeout = busy_timeout
        self._token = token
        self._on_batch = on_batch
        self._on_stopped = on_stopped
        self._max_batch = max_batch
        self.lock = threading.Lock()
        """Guards the queue and what :meth:`Write.take` decides (held for microseconds)."""
        self.gate = threading.Lock()
        """Held by the thread around each transaction; see :class:`._sqlite.Connection`."""
        self._wake = threading.Condition(self.lock)
        self._queue: deque[Write] = deque()
        self._batch: list[Write] = []  # taken into the transaction in flight
        self._seq = 0
        self._idle = False
        self._stopping = False
        self._loop_alive = True
        self.failure: StoreError | None = None
        self.batches = 0
        self.writes = 0
        self.largest_batch = 0
        self._thread = threading.Thread(target=self._run, name="subagents-store-writer")
        self._thread.daemon = True  # an unclosed store must not hang interpreter exit

    def start(self) -> None:
        self._thread.start()

    @property
    def queued(self) -> int:
        """Writes submitted and not yet taken into a batch."""
        return len(self._queue)

    @property
    def submitted(self) -> int:
        """The sequence number of the last write submitted."""
        return self._seq

    def submit(self, write: Write) -> int:
        """Queue ``write``; returns its sequence number. Never blocks.

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
            write.seq = self._seq
            self._queue.append(write)
            if self._idle:
                self._idle = False
                self._wake.notify()
            return self._seq

    def stop(self) -> None:
        """Commit what is queued, then end the thread (``on_stopped`` runs on the loop)."""
        with self.lock:
            self._stopping = True
            self._wake.notify()

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while True:
                with self.lock:
                    while not self._queue and not self._stopping:
                        self._idle = True
                        self._wake.wait()
                    self._idle = False
                    if not self._queue:
                        break
                if not self._commit_batch():
                    break
        except BaseException:  # a bug: say so, never die silently with writes queued
            logger.exception("the store's writer thread crashed")
            failure = StoreError(self._path, "failed", "the writer thread crashed")
            # The batch in hand is handed back too: each write's failed() must run, or
            # whoever waits for its commit waits forever.
            self._to_loop(self._on_batch, self._fail(failure, self._batch), self._seq, failure)
        finally:
            try:
                self._raw.close()
            except sqlite3.Error:
                logger.exception("closing the writer's connection failed")
            self._to_loop(self._on_stopped)

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
        """One transaction, then the batch's call into the event loop; False when the
        store failed."""
        raw = self._raw
        batch: list[Write] = []
        self._batch = batch
        watermark = 0

        def attempt() -> None:
            nonlocal watermark
            with immediate(raw):
                if not watermark:  # taken once the lock is held; a retry keeps the batch
                    watermark = self._take(batch)
                for kind, writes in itertools.groupby(batch, _kind):
                    kind.apply(raw, list(writes))

        failure, lost = self._commit_under_gate(attempt, batch)
        if failure is not None:
            self._to_loop(self._on_batch, lost, self._seq, failure)
            return False
        self._batch = []
        self.batches += 1
        self.writes += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        self._to_loop(self._on_batch, batch, watermark, None)
        return True

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

    def _to_loop(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the event loop and wait for it; once the loop has ended
        (a store never closed), writes still commit and nobody is told."""
        if not self._loop_alive:
            return
        try:
            anyio.from_thread.run_sync(fn, *args, token=self._token)
        except anyio.RunFinishedError:
            self._loop_alive = False
        except Exception:
            logger.exception("a store callback on the event loop raised")

    def join(self, timeout: float | None) -> bool:
        """Wait for the thread (blocking); True if it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
