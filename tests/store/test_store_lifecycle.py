"""The store's life in one process: what survives a close and a reopen, what a close does
to its mailboxes, delivery rows moving forward, a busy database, a failing one, and the
manager using the durable mailbox through its factory seam."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from subagents import (
    AgentSpec,
    DelegateResult,
    MailboxFull,
    Request,
    RunContext,
    SubagentManager,
)
from subagents.store import SqliteMailbox, SqliteStore, StoreError
from subagents.store import _deliveries as deliveries
from subagents.store._opening import Connections
from tests.store.support import block_the_loop_until_committed, env, sqlite

pytestmark = pytest.mark.anyio


def states(path: Path) -> list[tuple[str, str, str | None]]:
    """``(task_id, state, consumer)`` of every delivery row, in arrival order."""
    with sqlite(path) as conn:
        rows = conn.execute("SELECT task_id, state, consumer FROM deliveries ORDER BY id")
        return [(str(t), str(s), c) for t, s, c in rows]


@contextmanager
def writer_parked(store: SqliteStore) -> Iterator[threading.Event]:
    """Hold the store's writer thread before each transaction (before it takes the gate or
    any write) while the event yielded is clear: until the block ends, unless set sooner."""
    writer = store._writer
    go = threading.Event()
    commit_batch = writer._commit_batch

    def parked() -> bool:
        go.wait()
        return commit_batch()

    writer._commit_batch = parked  # type: ignore[method-assign]
    try:
        yield go
    finally:
        go.set()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_what_was_put_survives_a_close_and_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with SqliteStore(path) as store:
        a, b = store.mailbox("a"), store.mailbox("b")
        for key in ("x", "y", "z"):
            a.put(key, env(key))
        a.put("x", env("x", "again"))  # an overwrite: the newest arrival
        b.put("only", env("only", "é ünïcode ✓"))
        assert a.drain("y") == env("y")
        # No wait_committed: closing commits what is queued.
    async with SqliteStore(path) as store:
        a, b = store.mailbox("a"), store.mailbox("b")
        assert len(a) == 2
        assert a.peek("y") is None
        assert a.drain_all() == [env("z"), env("x", "again")]
        assert b.drain("only") == env("only", "é ünïcode ✓")
    got = states(path)
    final = {task_id: state for task_id, state, _ in got}  # the newest row of each id
    assert final == {"x": "read", "y": "read", "z": "read", "only": "read"}
    # The first x was never written (the overwrite came before the writer took it) or
    # was written and then replaced: never both read.
    assert [s for t, s, _ in got if t == "x"] in (["read"], ["replaced", "read"])


async def test_the_rows_move_forward_only(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    clock = Clock()
    async with SqliteStore(path) as store:
        box = store.mailbox("s", ttl=10.0, clock=clock)
        box.put("read", env("read"))
        box.put("over", env("over", "first"))
        await box.wait_committed()
        box.put("over", env("over", "second"))
        box.put("old", env("old"))
        await box.wait_committed()
        assert box.drain("read") == env("read")
        clock.now += 11
        assert box.drain_all() == []  # both expired: marked so, not returned
    got = states(path)
    assert [(t, s) for t, s, _ in got] == [
        ("read", "read"),
        ("over", "replaced"),
        ("over", "expired"),
        ("old", "expired"),
    ]
    consumer = got[0][2]
    assert consumer is not None
    assert consumer.split(".")[0].split("-")[0].isdigit()  # pid-hex.n: who took it
    with sqlite(path) as conn, pytest.raises(sqlite3.IntegrityError, match="forward"):
        conn.execute("UPDATE deliveries SET state = 'stored' WHERE task_id = 'read'")


async def test_a_put_consumed_before_the_writer_took_it_is_written_read(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with SqliteStore(path) as store:
        box = store.mailbox("s")
        with writer_parked(store):
            box.put("a", env("a"))
            assert box.drain("a") == env("a")
            box.put("b", env("b"))
            box.put("c", env("c"))
            assert box.drain_all() == [env("b"), env("c")]
        await box.wait_committed()
        assert len(box) == 0
    assert [(t, s) for t, s, _ in states(path)] == [("a", "read"), ("b", "read"), ("c", "read")]


async def test_closing_the_store_drops_its_mailboxes(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    with pytest.raises(RuntimeError, match="open the store first"):
        store.mailbox("s")
    got: list[DelegateResult | None] = []
    async with store:
        box = store.mailbox("s")

        async def waiter() -> None:
            got.append(await box.wait("never", timeout=None))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            async with anyio.create_task_group() as closers:  # two at once: both return
                closers.start_soon(store.aclose)
                closers.start_soon(store.aclose)
    assert got == [None]
    assert box.closed
    assert box.put("late", env("late")) is False
    assert store.closed
    await store.aclose()  # idempotent
    with pytest.raises(anyio.ClosedResourceError):
        store.mailbox("s")
    with pytest.raises(anyio.ClosedResourceError):
        await store.wait_committed()


async def test_two_mailboxes_of_one_session_in_one_process(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "store.db") as store:
        one, two = store.mailbox("s"), store.mailbox("s")
        got: list[DelegateResult | None] = []

        async def waiter() -> None:
            got.append(await two.wait("a", timeout=30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            one.put("a", env("a"))
        assert got == [env("a")]
        assert one.peek("a") is None
        one.put("b", env("b"))
        await one.wait_committed()
        assert two.drain("b") == env("b")
        assert one.drain("b") is None


async def test_a_put_taken_by_another_mailbox_before_its_commit_is_reported_is_gone(
    tmp_path: Path,
) -> None:
    """Between a put's commit and its report on the event loop (the courier's call), the
    database, not the putting mailbox's copy, says whether it is still unread."""
    path = tmp_path / "store.db"
    async with SqliteStore(path) as store:
        one, two = store.mailbox("s"), store.mailbox("s")
        one.put("a", env("a"))
        block_the_loop_until_committed(path, 1, store)  # so its report has not run
        assert two.drain("a") == env("a")
        assert one.peek("a") is None
        assert len(one) == 0
        assert one.drain("a") is None
        assert one.drain_all() == []


def a_and_b_committed_unreported(
    store: SqliteStore, path: Path, method: str
) -> tuple[SqliteMailbox, SqliteMailbox]:
    """Two mailboxes of session "s" (capacity 2); the first has put a and b with
    ``method``, and their batch has committed, but the loop has not run its report."""
    one, two = store.mailbox("s", capacity=2), store.mailbox("s", capacity=2)
    getattr(one, method)("a", env("a"))
    getattr(one, method)("b", env("b"))
    block_the_loop_until_committed(path, 2, store)
    return one, two


@pytest.mark.parametrize("method", ["put", "put_durable"])
async def test_puts_taken_by_another_mailbox_before_their_commit_is_reported_free_capacity(
    tmp_path: Path, method: str
) -> None:
    """A full mailbox whose puts another mailbox took in the window between their commit
    and its report is empty: its next put is accepted, not refused as full."""
    path = tmp_path / "store.db"
    async with SqliteStore(path) as store:
        one, two = a_and_b_committed_unreported(store, path, method)
        assert sorted(e.task_id for e in two.drain_all()) == ["a", "b"]
        assert one.put("c", env("c"))
        assert len(one) == 1
        await one.wait_committed()
        assert [e.task_id for e in two.drain_all()] == ["c"]


@pytest.mark.parametrize("method", ["put", "put_durable"])
async def test_a_put_over_one_taken_before_its_commit_is_reported_is_a_new_entry(
    tmp_path: Path, method: str
) -> None:
    """A put's id whose earlier put another mailbox took between its commit and its report
    has no entry to replace: into a full session the put is refused."""
    path = tmp_path / "store.db"
    async with SqliteStore(path) as store:
        one, two = a_and_b_committed_unreported(store, path, method)
        assert two.drain("a") == env("a")
        assert two.put("c", env("c"))
        block_the_loop_until_committed(path, 3, store)  # the session holds b and c: full
        with pytest.raises(MailboxFull):
            getattr(one, method)("a", env("a2"))
        assert one.put("b", env("b2"))  # b is still unread: this replaces it


async def test_a_cancelled_wait_for_the_commit_still_commits(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with SqliteStore(path) as store:
        box = store.mailbox("s")
        with writer_parked(store), anyio.CancelScope() as scope:
            box.put("a", env("a"))
            scope.cancel()
            await box.wait_committed()
        assert scope.cancelled_caught
        await box.wait_committed()
    assert [t for t, _, _ in states(path)] == ["a"]


class Heard(logging.Handler):
    """Sets :attr:`event` once a record containing ``text`` is logged (from any thread)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


async def test_a_locked_database_delays_writes_and_never_loses_them(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    heard = Heard("still retrying")
    logger = logging.getLogger("subagents.store")
    async with SqliteStore(path, busy_timeout=0.05) as store:
        box = store.mailbox("s")
        box.put("before", env("before"))
        await box.wait_committed()
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another connection holds the write lock
        logger.addHandler(heard)
        try:
            box.put("during", env("during"))
            # The writer reports that it keeps trying (its own words, from its thread).
            assert await anyio.to_thread.run_sync(heard.event.wait, 10)
            assert box.peek("during") == env("during")  # readable here meanwhile
            with pytest.raises(StoreError) as info:
                box.drain("before")  # a take needs the lock too: refused, nothing taken
            assert info.value.reason == "locked"
        finally:
            logger.removeHandler(heard)
            other.execute("ROLLBACK")
            other.close()
        await box.wait_committed()
        assert box.drain("before") == env("before")
    async with SqliteStore(path) as store:
        assert store.mailbox("s").drain_all() == [env("during")]


async def test_a_failing_database_keeps_what_it_could_not_write_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def disk_error(*args: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    async with SqliteStore(tmp_path / "store.db") as store:
        box = store.mailbox("s")
        box.put("kept", env("kept"))
        await box.wait_committed()
        monkeypatch.setattr(deliveries, "insert", disk_error)
        with caplog.at_level(logging.CRITICAL, logger="subagents.store"):
            box.put("lost", env("lost"))
            with pytest.raises(StoreError) as info:
                await box.wait_committed()
        assert info.value.reason == "failed"
        assert "disk I/O error" in str(info.value)
        with pytest.raises(StoreError, match="an earlier write failed"):
            box.put("refused", env("refused"))
        assert box.peek("lost") == env("lost")  # never written, still readable here
        assert box.drain_all() == [env("kept"), env("lost")]


async def test_statistics(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db", synchronous="NORMAL")
    assert store.statistics().batches == 0
    async with store:
        box = store.mailbox("s", capacity=100)
        for i in range(50):
            box.put(f"t{i}", env(f"t{i}"))
        await store.wait_committed()
        stats = store.statistics()
        assert stats.writes == 50
        assert 1 <= stats.batches <= 50
        assert 1 <= stats.largest_batch <= 50
        assert stats.queued == 0
        assert stats.watching == 0
        sub = box.subscribe_once("missing", lambda: None)
        assert store.statistics().watching == 1
        box.unsubscribe(sub)
        assert store.statistics().watching == 0
        assert stats.synchronous == "NORMAL"
        assert stats.path == str(tmp_path / "store.db")
        assert not stats.closed


async def test_the_manager_collects_through_the_durable_mailbox(tmp_path: Path) -> None:
    async def work(request: Request, ctx: RunContext) -> str:
        await anyio.lowlevel.checkpoint()
        return f"did {request.input}"

    path = tmp_path / "store.db"
    spec = AgentSpec(name="worker", description="does a thing", runner=work)
    async with SqliteStore(path) as store:
        async with SubagentManager([spec], mailbox_factory=store.mailbox) as manager:
            handles = [manager.spawn("worker", f"job {i}") for i in range(20)]
            results = [await manager.wait_result(h.task_id, timeout=30) for h in handles]
            assert [r.output for r in results] == [f"did job {i}" for i in range(20)]
            box = manager.mailbox()
            left = box.drain_all()
        await store.wait_committed()
    ids = {h.task_id for h in handles}
    assert {e.task_id for e in left} <= ids
    assert {t for t, _, _ in states(path)} == ids


def open_files(path: Path) -> int:
    """How many of this process's file descriptors point at ``path`` (Linux)."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with suppress(OSError):  # closed meanwhile
            count += os.readlink(fd) == str(path)
    return count


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
async def test_an_open_cancelled_midway_leaves_nothing_open(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SqliteStore(path)
    started, proceed = threading.Event(), threading.Event()
    open_files_of_store = store._open_files

    def held() -> Connections:
        started.set()
        proceed.wait()
        return open_files_of_store()

    store._open_files = held  # type: ignore[method-assign]

    async def opener() -> None:
        async with store:
            raise AssertionError("opened although cancelled")

    async with anyio.create_task_group() as tg:
        tg.start_soon(opener)
        await anyio.to_thread.run_sync(started.wait)
        tg.cancel_scope.cancel()  # while the worker thread is opening the file
        proceed.set()
    assert store.closed
    assert open_files(path) == 0
    async with SqliteStore(path) as again:
        assert open_files(path) == 3  # the writer's, the event loop's, the watcher's
        again.mailbox("s").put("a", env("a"))
    assert open_files(path) == 0


async def test_the_committed_hook_reports_each_written_put_once_durable(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with SqliteStore(path) as store:
        box = store.mailbox("s")
        seen: list[tuple[str, list[str]]] = []

        def committed(envelope: DelegateResult) -> None:
            # When it runs, the row is in the file, for every connection to read.
            with sqlite(path) as conn:
                ids = [t for (t,) in conn.execute("SELECT task_id FROM deliveries ORDER BY id")]
            seen.append((envelope.task_id, ids))

        box.committed = committed
        with writer_parked(store):
            box.put("a", env("a", "first"))
            box.put("a", env("a", "second"))  # overwrites before the writer took it
            box.put("b", env("b"))
            assert box.drain("b") == env("b")  # consumed before written: still reported
            assert seen == []
        await box.wait_committed()
        assert [task_id for task_id, _ in seen] == ["a", "b"]
        assert all(task_id in ids for task_id, ids in seen)
        box.committed = lambda envelope: 1 / 0  # a raising hook is ignored
        box.put("c", env("c"))
        await box.wait_committed()
        assert box.drain("c") == env("c")


# ---------------------------------------------------------------- the overlay's edges


@pytest.mark.parametrize("take", ["drain", "drain_all"])
@pytest.mark.parametrize("older", ["reported", "unreported"])
async def test_a_put_taken_before_the_writer_took_it_leaves_no_older_entry_of_its_id(
    tmp_path: Path, take: str, older: str
) -> None:
    """A put over a committed unread entry, taken here before the writer took it: the
    older entry was overwritten, so it is gone for this mailbox at once (peek, len and the
    takes), not readable again until the taken put's ``read`` row replaces it."""
    path = tmp_path / "store.db"
    async with SqliteStore(path) as store:
        box = store.mailbox("s")
        box.put("a", env("a", "first"))
        if older == "reported":
            await box.wait_committed()
        else:
            block_the_loop_until_committed(path, 1, store)  # committed, report not run
        with writer_parked(store):
            box.put("a", env("a", "second"))
            if take == "drain":
                assert box.drain("a") == env("a", "second")
            else:
                assert box.drain_all() == [env("a", "second")]
            assert box.peek("a") is None
            assert len(box) == 0
            assert box.drain("a") is None
            assert box.drain_all() == []
        await box.wait_committed()
    assert [(t, s) for t, s, _ in states(path)] == [("a", "replaced"), ("a", "read")]


@pytest.mark.parametrize("earlier", ["pending", "committed"])
async def test_a_durable_put_over_a_pending_put_counts_toward_capacity(
    tmp_path: Path, earlier: str
) -> None:
    """``put_durable`` of an id with a put of this mailbox still in hand (not committed,
    or committed and its report not run) counts once that put is taken: the mailbox's
    next new id is refused (capacity is exact for one object)."""
    path = tmp_path / "store.db"
    async with SqliteStore(path) as store:
        box = store.mailbox("s", capacity=1)
        box.put("a", env("a", "first"))
        if earlier == "committed":
            block_the_loop_until_committed(path, 1, store)  # its report has not run
        with writer_parked(store):
            assert box.put_durable("a", env("a", "second"))  # replaces a: accepted
            assert box.drain("a") == env("a", "first")
            # The session will hold a's durable put: it is full.
            with pytest.raises(MailboxFull):
                box.put("b", env("b"))
        await box.wait_committed()
        assert box.drain_all() == [env("a", "second")]


async def test_a_failed_durable_put_does_not_come_back_over_a_newer_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store fails with a ``put_durable`` and a later ``put`` of the same id queued:
    the later put is the entry kept here, not the overwritten durable one."""

    def disk_error(*args: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    async with SqliteStore(tmp_path / "store.db") as store:
        box = store.mailbox("s")
        with writer_parked(store):
            box.put_durable("a", env("a", "first"))
            box.put("a", env("a", "second"))
            monkeypatch.setattr(deliveries, "insert", disk_error)
        with caplog.at_level(logging.CRITICAL, logger="subagents.store"), pytest.raises(StoreError):
            await box.wait_committed()
        assert box.peek("a") == env("a", "second")
        assert box.drain_all() == [env("a", "second")]


async def test_a_pending_put_past_its_ttl_still_hides_the_entry_it_replaced(
    tmp_path: Path,
) -> None:
    """A put over a committed entry that outlives it (another object's, without a TTL)
    expires before the writer took it: the id has no live entry, here as it will in the
    database once the put is written (the older row ``replaced``); the overwritten
    envelope is never handed on."""
    path = tmp_path / "store.db"
    clock = Clock()
    async with SqliteStore(path) as store:
        keeping = store.mailbox("s", clock=clock)
        brief = store.mailbox("s", ttl=1.0, clock=clock)
        keeping.put("a", env("a", "first"))
        await keeping.wait_committed()
        with writer_parked(store):
            brief.put("a", env("a", "second"))
            clock.now += 2
            assert brief.peek("a") is None
            assert brief.drain("a") is None
            assert len(brief) == 0
            assert brief.peek("a") is None
            assert brief.drain("a") is None
            assert brief.drain_all() == []
        await brief.wait_committed()
        assert keeping.drain_all() == []
    assert [(t, s) for t, s, _ in states(path)] == [("a", "replaced"), ("a", "expired")]


class GateWatched:
    """A lock that sets ``trying`` as someone starts to acquire it."""

    def __init__(self, lock: threading.Lock | None, *, trying: threading.Event) -> None:
        assert lock is not None
        self._lock, self._trying = lock, trying

    def acquire(self, timeout: float = -1) -> bool:
        self._trying.set()
        return self._lock.acquire(timeout=timeout)

    def release(self) -> None:
        self._lock.release()


@pytest.mark.parametrize("take", ["drain", "drain_all"])
async def test_a_crashed_writer_hands_its_batch_back_before_a_take_can_miss_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, take: str
) -> None:
    """The writer thread crashes (an error that is not SQLite's) with a put in its batch:
    a take that gets the gate once the transaction has rolled back must not find the put
    still "in the writer's hands" and lose it; it is never written, so it stays here."""

    def a_bug(*args: object) -> None:
        raise RuntimeError("a bug in the writer")

    async with SqliteStore(tmp_path / "store.db") as store:
        writer = store._writer
        failing, go = threading.Event(), threading.Event()
        fail = writer._fail

        def slow_fail(failure: StoreError, batch: list) -> list:  # type: ignore[type-arg]
            failing.set()  # the transaction rolled back
            go.wait(30)
            return fail(failure, batch)

        writer._fail = slow_fail  # type: ignore[method-assign]
        monkeypatch.setattr(deliveries, "insert", a_bug)
        box = store.mailbox("s")
        box._conn._gate = GateWatched(box._conn._gate, trying=go)  # type: ignore[arg-type]
        with caplog.at_level(logging.CRITICAL, logger="subagents.store"):
            box.put("a", env("a"))
            assert failing.wait(30)
            try:  # the take's gate lets the hand-back go on (then waits for it, if held)
                got = box.drain("a") if take == "drain" else box.drain_all()
            finally:
                go.set()
            with pytest.raises(StoreError):
                await box.wait_committed()
        kept = [got] if take == "drain" else got
        assert kept + box.drain_all() == [env("a")]


async def test_a_committed_put_past_its_ttl_does_not_hide_a_newer_entry_from_drain(
    tmp_path: Path,
) -> None:
    """A put whose batch has committed is the database's to answer for, also when it has
    expired before its report ran: another object's later put of the id, committed and
    still live, replaced it there, and ``drain`` takes it (as ``peek`` sees it)."""
    path = tmp_path / "store.db"
    clock = Clock()
    async with SqliteStore(path) as store:
        one = store.mailbox("s", ttl=1.0, clock=clock)
        two = store.mailbox("s", ttl=1.0, clock=clock)
        one.put("a", env("a", "first"))
        clock.now += 0.5
        two.put("a", env("a", "second"))
        block_the_loop_until_committed(path, 2, store)  # their reports have not run
        clock.now += 0.7  # one's put has expired, two's has not
        assert one.peek("a") == env("a", "second")
        assert one.drain("a") == env("a", "second")
