"""A room's life and its looks: opened once, closed under a waiting receive, read-only
opens that change nothing, a timed receive that ends by its deadline while another
connection holds the lock, members signalled when they can be woken again, and entries
and closes that race."""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from subagents import ConfigError
from subagents._cli import main
from subagents.room import Room, _lifecycle, room_tools
from subagents.room._opening import open_read_write
from subagents.store import StoreError
from tests.room.support import NO_SUCH_PID, FakeClock, open_files

pytestmark = pytest.mark.anyio


async def test_a_room_is_entered_once_at_a_time(tmp_path: Path) -> None:
    room = Room(tmp_path / "s.db")
    async with room:
        with pytest.raises(RuntimeError, match="open already"):
            await room.__aenter__()
        await room.join("r")  # the first opening still works
    async with room:  # closed, it may be opened again
        await room.who()


async def test_closing_a_room_ends_a_waiting_receive_with_closed_resource_error(
    tmp_path: Path,
) -> None:
    ended = anyio.Event()
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r")).member_id

        async def waiting() -> None:
            with pytest.raises(anyio.ClosedResourceError):
                await room.receive(member, timeout=None)
            ended.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting)
            await anyio.wait_all_tasks_blocked()
            await room.aclose()
            with anyio.fail_after(10):
                await ended.wait()
        with pytest.raises(anyio.ClosedResourceError):
            await room.unread(member)


class _Holder:
    """Another connection that commits a delivery and takes the write lock at once, then
    holds it until released (or for 20 s)."""

    def __init__(self, path: Path, sender: str, recipient: str) -> None:
        self.path, self.sender, self.recipient = path, sender, recipient
        self.release = threading.Event()
        self.ready_at: float | None = None
        self.lost = False
        self.delivery = 0

    def run(self) -> None:
        with closing(sqlite3.connect(self.path, isolation_level=None, timeout=30)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            ((message,),) = conn.execute(
                "INSERT INTO room_messages (sender, selector, body, created_at, recipients) "
                "VALUES (?, ?, 'x', 0, 1) RETURNING id",
                (self.sender, self.recipient),
            ).fetchall()
            ((self.delivery,),) = conn.execute(
                "INSERT INTO room_deliveries (message_id, recipient, state, created_at, "
                "changed_at) VALUES (?, ?, 'stored', 0, 0) RETURNING id",
                (message, self.recipient),
            ).fetchall()
            conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")
            ((state,),) = conn.execute(
                "SELECT state FROM room_deliveries WHERE id = ?", (self.delivery,)
            ).fetchall()
            self.lost = state != "stored"  # the receive took it between the two: again
            self.ready_at = time.monotonic()
            self.release.wait(20)
            conn.execute("ROLLBACK")


async def test_a_timed_receive_returns_by_its_deadline_while_another_connection_holds_the_lock(
    tmp_path: Path,
) -> None:
    """The receive wakes on a commit and finds a delivery, but another connection took the
    write lock right after committing it: the take waits for the lock only as long as the
    receive has left, not ``busy_timeout`` (30 s here), and returns empty, nothing taken."""
    path = tmp_path / "s.db"
    armed, took = threading.Event(), threading.Event()

    def clock() -> float:  # read inside each transaction: the first take has run
        if armed.is_set():
            took.set()
        return time.time()

    async with Room(path, busy_timeout=30, clock=clock) as room:
        sender = (await room.join("r")).member_id
        member = (await room.join("r")).member_id
        for _ in range(10):
            holder = _Holder(path, sender, member)
            took.clear()
            armed.set()

            def hold(holder: _Holder = holder) -> None:
                took.wait(20)
                holder.run()

            thread = threading.Thread(target=hold)
            thread.start()
            start = time.monotonic()
            try:
                got = await room.receive(member, timeout=1.0)
            finally:
                armed.clear()
                holder.release.set()
                await anyio.to_thread.run_sync(thread.join)
            if holder.lost or holder.ready_at is None or holder.ready_at > start + 1.0:
                continue  # the lock was not held before the deadline: not this case
            assert got.messages == ()
            with closing(sqlite3.connect(path)) as conn:
                (state,) = conn.execute(
                    "SELECT state FROM room_deliveries WHERE id = ?", (holder.delivery,)
                ).fetchone()
            assert state == "stored"
            return
        pytest.fail("the lock was never held while the receive waited")


async def test_a_member_that_can_be_woken_again_is_signalled_for_what_waits(
    tmp_path: Path,
) -> None:
    """Back with a running process (a re-join), an ``undeliverable`` delivery is
    ``offered``; raised to ``wake``, a ``stored`` one is."""
    async with Room(tmp_path / "s.db", clock=FakeClock()) as room:
        sender = (await room.join("r")).member_id
        gone_key, held_key = str(uuid.uuid4()), str(uuid.uuid4())
        gone = (await room.join("r", harness_key=gone_key, pid=NO_SUCH_PID)).member_id
        held = (await room.join("r", harness_key=held_key, autonomy="hold")).member_id
        await room.send(sender, "*", "x")
        (sent,) = await room.sent(sender)
        assert sent.states == {gone: "undeliverable", held: "stored"}
        await room.join("r", harness_key=gone_key, pid=NO_SUCH_PID)  # still no process
        await room.join("r", harness_key=held_key)  # not raised
        (sent,) = await room.sent(sender)
        assert sent.states == {gone: "undeliverable", held: "stored"}
        await room.join("r", harness_key=gone_key)  # back, with this process
        await room.join("r", harness_key=held_key, autonomy="wake")
        (sent,) = await room.sent(sender)
        assert sent.states == {gone: "offered", held: "offered"}


async def test_leaving_the_last_room_by_name_releases_the_members_leases(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "x.py")
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", extra_rooms=["s"])).member_id
        assert (await room.claim(member, target)).ok
        assert await room.leave(member, "r") == ("s",)
        assert not (await room.check(target)).free
        assert await room.leave(member, "s") == ()
        assert (await room.check(target)).free


def _data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


async def test_the_read_only_tools_write_nothing(tmp_path: Path) -> None:
    """``check_file`` and ``drift_check`` are marked ``readOnlyHint``: with a message
    waiting (so the ``unread`` rider runs), no connection commits."""
    path = tmp_path / "s.db"
    (tmp_path / "f.txt").write_text("one")
    async with Room(path) as room:
        sender = (await room.join("r")).member_id
        member = (await room.join("r", cwd=str(tmp_path))).member_id
        await room.note_read(member, "f.txt")
        await room.send(sender, member, "x")
        tools = {tool.name: tool for tool in room_tools(room, member)}
        with closing(sqlite3.connect(path)) as conn:
            before = _data_version(conn)
            for name in ("check_file", "drift_check"):
                result = await tools[name].execute({"path": "f.txt"})
                assert not result.is_error, result.content
                assert result.details["unread"] == 1
            assert _data_version(conn) == before


def _older_store(path: Path) -> None:
    """A store of schema version 2 (before the room's tables)."""

    async def create() -> None:
        async with Room(path):
            pass

    anyio.run(create)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        names = conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'room%'"
        ).fetchall()
        for (name,) in names:
            conn.execute(f"DROP TABLE {name}")
        conn.execute("DELETE FROM schema_version WHERE version = 3")
        conn.execute("PRAGMA user_version = 2")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _version(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT max(version) FROM schema_version").fetchone()[0])


@pytest.mark.parametrize("command", ["who", "history", "leases"])
def test_the_read_only_commands_refuse_an_older_or_empty_store_and_change_nothing(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = {"who": [], "history": ["--room", "r"], "leases": ["--path", "/tmp/x"]}[command]
    older = tmp_path / "old.db"
    _older_store(older)
    assert main(["room", command, "--store", str(older), *extra]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "schema version 2" in err
    assert _version(older) == 2
    empty = tmp_path / "empty.db"
    empty.touch()
    assert main(["room", command, "--store", str(empty), *extra]) == 1
    assert "missing or empty" in capsys.readouterr().err
    assert empty.stat().st_size == 0


async def test_a_read_only_room_looks_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with Room(path) as room:
        member = (await room.join("r")).member_id
    async with Room(path, read_only=True) as room:
        assert [m.member_id for m in await room.who("r")] == [member]
        assert await room.unread(member) == 0
        with pytest.raises(StoreError) as caught:
            await room.join("r")
        assert caught.value.reason == "unwritable"
    with pytest.raises(StoreError, match="missing or empty"):
        async with Room(tmp_path / "none.db", read_only=True):
            pass
    assert not (tmp_path / "none.db").exists()


async def test_an_aclose_while_the_file_opens_wins_and_closes_what_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A room closed by another task while its entry still opens the file ends closed:
    the entry raises ``ClosedResourceError`` and no connection is left open."""
    started, gate = threading.Event(), threading.Event()

    def slow_open(*args: Any, **kwargs: Any) -> tuple[sqlite3.Connection, sqlite3.Connection]:
        started.set()
        gate.wait(20)
        return open_read_write(*args, **kwargs)

    monkeypatch.setattr(_lifecycle, "open_read_write", slow_open)
    room = Room(tmp_path / "s.db")
    outcomes: list[str] = []

    async def enter() -> None:
        try:
            await room.__aenter__()
        except anyio.ClosedResourceError:
            outcomes.append("closed")
        else:
            outcomes.append("entered")

    async with anyio.create_task_group() as tg:
        tg.start_soon(enter)
        await anyio.to_thread.run_sync(started.wait, 20)
        await room.aclose()
        gate.set()
    assert outcomes == ["closed"]
    assert open_files(tmp_path) == []
    with pytest.raises(anyio.ClosedResourceError):
        await room.who()


async def test_a_call_that_reaches_the_connection_as_the_room_closes_says_closed(
    tmp_path: Path,
) -> None:
    """A call already past its check of the room when ``aclose`` runs (its worker thread
    not yet holding the connection) gets the closed room's error, not SQLite's
    "Cannot operate on a closed database" as a ``StoreError``."""
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r")).member_id
        database = room._db()  # what a call in flight holds
    with pytest.raises(anyio.ClosedResourceError):
        await database.look(member, lambda raw, found, now: found)
    with pytest.raises(anyio.ClosedResourceError):
        await database.write(lambda raw, now: None)


async def test_a_timed_receive_whose_first_take_cannot_get_the_lock_answers_with_the_inbox(
    tmp_path: Path,
) -> None:
    """Another connection holds the write lock from before the receive until it returns:
    the first take gives up at the deadline, takes nothing, and the answer still says
    where it looked (the inbox block, read without the write lock)."""
    path = tmp_path / "s.db"
    async with Room(path, busy_timeout=30) as room:
        sender = (await room.join("r")).member_id
        member = (await room.join("r")).member_id
        await room.send(sender, member, "waiting")
        held, done = threading.Event(), threading.Event()

        def hold() -> None:
            with closing(sqlite3.connect(path, isolation_level=None)) as conn:
                conn.execute("BEGIN IMMEDIATE")
                held.set()
                done.wait(20)
                conn.execute("ROLLBACK")

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            await anyio.to_thread.run_sync(held.wait, 20)
            got = await room.receive(member, timeout=0.05)
        finally:
            done.set()
            await anyio.to_thread.run_sync(holder.join)
        assert got.messages == ()
        assert got.inbox is not None
        assert (got.inbox.deliveries, got.inbox.read) == (1, 0)
        assert await room.unread(member) == 1


async def test_a_receive_with_a_tiny_timeout_still_takes_what_waits(tmp_path: Path) -> None:
    """The deadline bounds the wait for the lock, but the first try always runs: a
    timeout shorter than any transaction still takes a waiting message."""
    async with Room(tmp_path / "s.db") as room:
        sender = (await room.join("r")).member_id
        member = (await room.join("r")).member_id
        await room.send(sender, member, "here")
        got = await room.receive(member, timeout=1e-9)
        assert [m.body for m in got.messages] == ["here"]


async def test_a_bad_synchronous_mode_is_a_config_error_naming_it(tmp_path: Path) -> None:
    """SqliteStore refuses anything but FULL and NORMAL; the room's file must not be opened
    with ``OFF`` (or a typo SQLite reads as some level) without a word."""
    for bad in ("OFF", "bogus"):
        with pytest.raises(ConfigError, match=r"^synchronous"):
            Room(tmp_path / "s.db", synchronous=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["busy_timeout", "poll_interval"])
def test_a_wait_longer_than_a_thread_can_wait_is_a_config_error_naming_it(
    tmp_path: Path, field: str
) -> None:
    # Beyond threading.TIMEOUT_MAX the room's threads would die on their first wait.
    with pytest.raises(ConfigError, match=f"^{field}"):
        Room(tmp_path / "s.db", **{field: threading.TIMEOUT_MAX * 2})


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_timed_receive_returns_by_its_deadline_while_another_process_holds_the_lock(
    tmp_path: Path,
) -> None:
    """``receive(timeout=...)`` "returns by its deadline". Its first take waits for the
    write lock only for the time left, not ``busy_timeout`` (here 30 s), so a lock held by
    another connection does not keep it past its deadline."""
    path = tmp_path / "s.db"
    async with Room(path, busy_timeout=30) as room:
        member = (await room.join("r")).member_id
        held, done = threading.Event(), threading.Event()

        def hold() -> None:
            with closing(sqlite3.connect(path, isolation_level=None)) as conn:
                conn.execute("BEGIN IMMEDIATE")
                held.set()
                done.wait(1.8)  # released at once when receive returns
                conn.execute("ROLLBACK")

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            await anyio.to_thread.run_sync(held.wait)
            start = anyio.current_time()
            await room.receive(member, timeout=0.1)
            took = anyio.current_time() - start
        finally:
            done.set()
            await anyio.to_thread.run_sync(holder.join)
        # The lock is held 1.8 s; a receive that keeps its 0.1 s deadline is back long before.
        assert took < 1.5, f"receive(timeout=0.1) returned after {took:.2f} s"


async def test_a_room_entered_twice_at_once_is_refused_once(tmp_path: Path) -> None:
    """Entering an open Room again is refused, and so is entering it while the first entry
    is still opening: two tasks entering at once would both open, the second's connections
    replacing the first's, which are never closed."""
    room = Room(tmp_path / "s.db")
    outcomes: list[str] = []

    async def enter() -> None:
        try:
            await room.__aenter__()
        except RuntimeError:
            outcomes.append("refused")
        else:
            outcomes.append("entered")

    async with anyio.create_task_group() as tg:
        tg.start_soon(enter)
        tg.start_soon(enter)
    await room.aclose()
    assert sorted(outcomes) == ["entered", "refused"]


@pytest.mark.parametrize("anyio_backend", ["trio"])  # asyncio's GC happens to free it
async def test_a_room_closed_in_a_cancelled_scope_closes_its_connection(
    tmp_path: Path,
) -> None:
    """``aclose`` under cancellation raises at its first thread hop (the watcher's join);
    the writer connection and its files must be closed all the same."""
    room = Room(tmp_path / "s.db")
    with anyio.CancelScope() as scope:
        async with room:
            await room.join("r")
            scope.cancel()
            await anyio.lowlevel.checkpoint()
    gc.collect()
    assert open_files(tmp_path) == []
