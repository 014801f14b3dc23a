"""``SqliteStore``: one SQLite file in WAL mode, its writer thread, its watcher, and the
mailboxes kept in it.

Three connections per store, each used by one thread: the writer's (group commit), the
event loop's (reads, and the takes of ``drain``/``drain_all``), the watcher's (polling
``PRAGMA data_version``). Opening (:mod:`._opening`) runs in a worker thread.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import secrets
import sqlite3
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Final, Literal

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs
from anyio.lowlevel import current_token

from .._envelope import DelegateResult, encodes
from .._errors import ConfigError
from .._journal import SpawnEntry
from .._mailbox import DEFAULT_MAILBOX_CAPACITY
from .._validators import count, seconds, text, thread_wait
from . import _deliveries as rows
from ._errors import StoreError
from ._journal import SqliteJournal
from ._mailbox import SqliteMailbox
from ._merging import merge_ends
from ._opening import Connections, close_all, open_connections
from ._recovery import OPEN_ORIGINS, ReleaseWrite
from ._sqlite import Connection, Synchronous
from ._tally import Tally
from ._watch import Watcher
from ._writer import Write, Writer

__all__ = ["DEFAULT_BUSY_TIMEOUT", "DEFAULT_POLL_INTERVAL", "SqliteStore", "StoreStatistics"]

logger = logging.getLogger("subagents.store")

DEFAULT_BUSY_TIMEOUT: Final = 10.0
DEFAULT_POLL_INTERVAL: Final = 0.005
_LOOP_RETRIES: Final = 0.1
"""Seconds the event loop's connection retries busy answers: SQLite's own wait (up to
``busy_timeout``) comes first, and a loop must not block much longer."""
_CLOSE_MARGIN: Final = 5.0
"""Seconds ``aclose`` waits for the writer beyond ``busy_timeout`` before leaving it."""

_State = Literal["new", "opening", "open", "closing", "closed"]


@attrs.frozen(kw_only=True)
class StoreStatistics:
    """A snapshot of a store's counters."""

    path: str
    """The store's file."""
    synchronous: str
    """``FULL`` or ``NORMAL``."""
    batches: int
    """Transactions the writer thread committed."""
    writes: int
    """Writes committed in them (so ``writes / batches`` is the mean batch)."""
    largest_batch: int
    """The most writes one transaction held."""
    queued: int
    """Writes submitted, not yet taken by the writer."""
    watching: int
    """Mailboxes with subscriptions: the watcher polls while this is above 0."""
    polls: int
    """``PRAGMA data_version`` reads by the watcher."""
    closed: bool
    """True once :meth:`SqliteStore.aclose` has finished."""


class SqliteStore:
    """A durable store in one SQLite file, shared by the processes of one machine.

    ``async with SqliteStore(path) as store:`` opens it (creating the file if needed) and
    closes it on exit; :meth:`mailbox` makes the durable mailbox of a session, e.g.
    ``SubagentManager(mailbox_factory=store.mailbox)``. Use a store from the event loop
    that opened it (asyncio or trio).

    Args:
        path: the database file. Its directory must exist and be writable (WAL mode keeps
            ``-wal`` and ``-shm`` files beside it); a local file system (WAL does not work
            over NFS).
        synchronous: how the writer thread commits puts. ``"FULL"`` (default): each
            commit is fsynced, and a put acknowledged by ``wait_committed`` survives a
            power loss. ``"NORMAL"``: it survives a crash of the process, but the last ones
            may be lost in a power loss or OS crash (the database stays consistent). Takes
            (``drain``) always commit as ``NORMAL``: after a power loss the last ones may
            be undone, and their envelopes delivered again, never lost.
        busy_timeout: seconds a connection waits for another's write lock before retrying
            (and then failing, on the event loop, with ``StoreError(reason="locked")``).
        poll_interval: seconds between two looks for other processes' commits, made only
            while a mailbox of this store has subscriptions (a ``wait`` among them).
        commit_delay: seconds the writer waits after a commit before it opens the next
            transaction (at once when 256 writes are queued): fewer, larger commits, each
            write's commit up to this much later. ``0`` (default): a transaction opens as
            soon as the last one's writes are handed on. For a user bound by throughput
            whose writes trickle in (a batch of subprocesses), where each write would
            otherwise get a commit, and an fsync, of its own.

    Raises:
        ConfigError: an argument is out of range.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        commit_delay: float = 0.0,
    ) -> None:
        try:
            self._path = os.fspath(path)
        except TypeError:
            raise ConfigError("path", "a str or os.PathLike path", path) from None
        if not isinstance(self._path, str) or not self._path:
            raise ConfigError("path", "a non-empty str path", path)
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigError("synchronous", "'FULL' or 'NORMAL'", synchronous)
        self._synchronous: Synchronous = synchronous
        self._busy_timeout = thread_wait("busy_timeout", busy_timeout, zero_ok=False)
        self._poll_interval = thread_wait("poll_interval", poll_interval, zero_ok=False)
        self._commit_delay = thread_wait("commit_delay", commit_delay, zero_ok=True)
        self._state: _State = "new"
        self._origin = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._mailboxes: weakref.WeakSet[SqliteMailbox] = weakref.WeakSet()
        self._watched: set[SqliteMailbox] = set()
        self._committed = 0
        self._orphans: list[SpawnEntry] = []  # claims an abandoned recovery left
        self._tallies: dict[str, Tally] = {}  # by session: the mailboxes' capacity tallies
        self._failure: StoreError | None = None
        self._waiters: list[tuple[int, int, anyio.Event]] = []
        self._tiebreak = itertools.count()
        self._stopped = anyio.Event()
        self._closed = anyio.Event()

    @property
    def path(self) -> str:
        return self._path

    @property
    def synchronous(self) -> Synchronous:
        return self._synchronous

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    def __repr__(self) -> str:
        return f"<SqliteStore {self._path!r} {self._state}>"

    async def __aenter__(self) -> SqliteStore:
        """Open the store (in a worker thread: the checks, WAL mode, the migrations).

        Raises:
            StoreError: the file is not a store, has a newer schema, cannot be written, is
                damaged or stays locked; the file was left as it was.
            RuntimeError: the store was opened before.
        """
        if self._state != "new":
            raise RuntimeError(f"a SqliteStore opens once; this one is {self._state}")
        self._state = "opening"
        token = current_token()
        raws: tuple[sqlite3.Connection, ...] = ()
        try:
            # A cancellation arriving while the thread works waits for it (the thread is
            # not abandoned), so its connections are in hand to be closed here.
            raws = await anyio.to_thread.run_sync(self._open_files)
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            close_all(list(raws))
            self._state = "closed"
            self._closed.set()
            raise
        writer_raw, loop_raw, watch_raw = raws
        self._writer = Writer(
            writer_raw,
            path=self._path,
            busy_timeout=self._busy_timeout,
            token=token,
            on_batch=self._on_batch,
            on_stopped=self._writer_stopped,
            prepare=merge_ends,
            commit_delay=self._commit_delay,
        )
        self._conn = Connection(
            loop_raw,
            path=self._path,
            busy_timeout=self._busy_timeout,
            retry_timeout=min(self._busy_timeout, _LOOP_RETRIES),
            gate=self._writer.gate,
        )
        self._watcher = Watcher(
            watch_raw, token=token, interval=self._poll_interval, on_change=self._on_change
        )
        self._watcher.start()  # first: it reads the database, and may fail
        self._writer.start()
        self._state = "open"
        OPEN_ORIGINS.add(self._origin)
        return self

    def _open_files(self) -> Connections:
        """In a worker thread: check, create or migrate, and connect three times."""
        return open_connections(
            self._path, synchronous=self._synchronous, busy_timeout=self._busy_timeout
        )

    def _require_open(self) -> None:
        if self._state != "open":
            if self._state in ("closing", "closed"):
                raise anyio.ClosedResourceError(f"the store {self._path!r} is closed")
            raise RuntimeError(f"open the store first: async with SqliteStore({self._path!r})")

    def mailbox(
        self,
        session_id: str,
        *,
        capacity: int = DEFAULT_MAILBOX_CAPACITY,
        ttl: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> SqliteMailbox:
        """The durable mailbox of ``session_id``: a new object over the session's rows.

        Usable as ``SubagentManager(mailbox_factory=store.mailbox)``. Every process (and
        every object) opening the same session shares its entries.

        Args:
            session_id: the session whose envelopes it holds.
            capacity: maximum distinct unread task ids (default 64).
            ttl: seconds an entry stays readable; ``None`` keeps entries until read.
            clock: the time source of ``ttl``, in seconds (default: unix time, which every
                process on the machine shares).

        Raises:
            ConfigError: an argument is out of range.
            anyio.ClosedResourceError: the store is closed.
        """
        self._require_open()
        session_id = text("session_id", session_id)
        if not encodes(session_id):  # SQLite stores UTF-8
            raise ConfigError("session_id", "a str that encodes as UTF-8", session_id)
        box = SqliteMailbox(
            session_id,
            conn=self._conn,
            writer=self._writer,
            origin=self._origin,
            watch=self._watch,
            wait_committed=self._wait_seq,
            capacity=count("capacity", capacity, minimum=1),
            ttl=seconds("ttl", ttl, none_ok=True, zero_ok=False),
            clock=clock,
            tally=self._tally(session_id),
        )
        self._mailboxes.add(box)
        return box

    def _tally(self, session_id: str) -> Tally:
        tally = self._tallies.get(session_id)
        if tally is None:
            tally = self._tallies[session_id] = Tally()
        return tally

    def _delivered(self, session_id: str | None) -> None:
        """The journal puts envelopes into ``session_id``'s mailbox (every session's:
        ``None``) that no mailbox counted."""
        tallies = self._tallies.values() if session_id is None else [self._tally(session_id)]
        for tally in tallies:
            tally.stale()

    def journal(self) -> SqliteJournal:
        """The journal of spawns kept in this store (what ``SubagentManager(store=...)``
        writes each spawn, start and end through). Usable before the store is open; its
        calls need it open."""
        return SqliteJournal(
            origin=self._origin,
            path=self._path,
            submit=self._submit,
            amend=self._amend,
            read=self._read,
            wait_committed=self._wait_seq,
            decode=self._decode,
            orphans=self._orphans,
            delivered=self._delivered,
        )

    def _submit(self, write: Write) -> int:
        self._require_open()
        return self._writer.submit(write)

    def _amend(self, change: Callable[[], bool]) -> bool:
        """``change()`` under the writer's lock, where it decides whether a queued write
        may still change (the writer takes none meanwhile); False unless the store is open."""
        if self._state != "open":
            return False
        with self._writer.lock:
            return change()

    def _read(self, query: Callable[[sqlite3.Connection], object]) -> object:
        self._require_open()
        return self._conn.read(query)

    def _decode(self, body: bytes) -> DelegateResult:
        return rows.decode(self._path, body)

    def _watch(self, box: SqliteMailbox, active: bool) -> None:
        if active:
            self._watched.add(box)
        else:
            self._watched.discard(box)
        if self._state == "open":
            self._watcher.watch(bool(self._watched))

    def _on_change(self) -> None:
        for box in list(self._watched):
            try:
                box._look_again()
            except Exception:
                logger.exception("looking for other processes' puts in %r failed", box)

    def _on_batch(self, writes: list[Write], watermark: int, failure: StoreError | None) -> None:
        # Each write's callback alone: one that raises must not keep the others' (or the
        # waiters below) from learning what became of their writes.
        if failure is None:
            self._committed = max(self._committed, watermark)
            for write in writes:
                _tell(write.done)
        else:
            self._failure = failure
            for write in writes:
                _tell(write.failed)
        waiters = self._waiters
        while waiters and (failure is not None or waiters[0][0] <= self._committed):
            heapq.heappop(waiters)[2].set()

    async def _wait_seq(self, seq: int) -> None:
        if seq > self._committed and self._failure is None:
            event = anyio.Event()
            heapq.heappush(self._waiters, (seq, next(self._tiebreak), event))
            await event.wait()
        else:
            await anyio.lowlevel.checkpoint()
        if seq > self._committed and self._failure is not None:
            raise StoreError(
                self._path, self._failure.reason, f"the write failed: {self._failure.detail}"
            )

    async def wait_committed(self) -> None:
        """Block until every write submitted to this store so far is committed.

        Cancellation stops the wait, not the writes.

        Raises:
            StoreError: the store failed before committing them.
            anyio.ClosedResourceError: the store is not open.
        """
        self._require_open()
        await self._wait_seq(self._writer.submitted)

    def statistics(self) -> StoreStatistics:
        """A snapshot of the store's counters (zeros before it is open)."""
        opened = self._state not in ("new", "opening")
        writer = self._writer if opened else None
        return StoreStatistics(
            path=self._path,
            synchronous=self._synchronous,
            batches=writer.batches if writer else 0,
            writes=writer.writes if writer else 0,
            largest_batch=writer.largest_batch if writer else 0,
            queued=writer.queued if writer else 0,
            watching=len(self._watched),
            polls=self._watcher.polls if opened else 0,
            closed=self._state == "closed",
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _writer_stopped(self) -> None:
        """The writer has committed its queue and ended: only now may a recovery (in
        this process) take this store's unfinished tasks for a dead process's. A writer
        that stopped because the store failed leaves them live while the store is open:
        its children still run, and ``aclose`` lets them go."""
        if self._state in ("closing", "closed"):
            OPEN_ORIGINS.discard(self._origin)
        self._stopped.set()

    async def aclose(self) -> None:
        """Commit what is queued, drop every mailbox of this store, stop its threads and
        close the file. Idempotent; a second caller waits for the first.

        Blocks until the writer has committed its queue, shielded from cancellation for up
        to ``busy_timeout`` + 5 s; past that (the database stays locked) it logs an error
        and returns, and the writer thread goes on committing in the background. The
        store's tasks count as live (no recovery takes them) until the writer has stopped.
        """
        if self._state in ("closing", "closed"):
            await self._closed.wait()
            return
        if self._state != "open":
            self._state = "closed"
            self._closed.set()
            return
        self._state = "closing"
        with anyio.CancelScope(shield=True):
            for box in list(self._mailboxes):
                box.drop()
            if self._orphans:  # claims no manager took: the next recovery's, anywhere
                release = ReleaseWrite(self._origin, [e.task_id for e in self._orphans])
                self._orphans.clear()
                with contextlib.suppress(StoreError):  # failed: recovery sees a dead owner
                    self._writer.submit(release)
            self._writer.stop()
            self._watcher.stop()
            with anyio.move_on_after(self._busy_timeout + _CLOSE_MARGIN):
                await self._stopped.wait()
            if self._stopped.is_set():  # also when it stopped earlier, on a failure
                OPEN_ORIGINS.discard(self._origin)
            else:
                logger.error(
                    "store %r: the writer did not finish within %.0f s; it goes on in the "
                    "background",
                    self._path,
                    self._busy_timeout + _CLOSE_MARGIN,
                )
            await anyio.to_thread.run_sync(self._watcher.join, self._poll_interval + 1.0)
            await anyio.to_thread.run_sync(self._conn.close)
            self._state = "closed"
            self._closed.set()


def _tell(callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception:
        logger.exception("a store write's callback %r raised; ignored", callback)
