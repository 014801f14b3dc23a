"""When a manager on a store hands an envelope on: with durability "sync" (the default)
only once the store has committed it, so nothing a parent has seen can be lost; with
"async" at once, the commit following. Another connection holding the write lock keeps
the store's writer from committing, which makes the two observable."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from subagents import (
    AgentSpec,
    CompletionNotifier,
    DelegateResult,
    Request,
    RunContext,
    Status,
    SubagentConfig,
    SubagentManager,
)
from subagents.store import SqliteStore, StoreError, _deliveries, _journal_writes, _watch
from tests.store.support import env, sqlite, write_locked

pytestmark = pytest.mark.anyio

COMPLETED = "subagent.completed"
MAILBOX_FULL = "subagent.mailbox_full"


@pytest.fixture(autouse=True)
def _quiet_busy_writer(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The writer warns while the lock is held, and logs the failure the tests cause."""
    with caplog.at_level(logging.CRITICAL, logger="subagents"):
        yield


def committed_end(path: Path, task_id: str) -> str | None:
    """The task's state on disk, as another process would read it."""
    with sqlite(path) as conn:
        row = conn.execute("SELECT state FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    return None if row is None else str(row[0])


async def _echo(request: Request, ctx: RunContext) -> str:
    return f"echo {request.input}"


class Finished:
    """An agent whose start says that the child before it (one slot) has finalized."""

    def __init__(self) -> None:
        self.started = anyio.Event()

    async def __call__(self, request: Request, ctx: RunContext) -> str:
        self.started.set()
        return "next"


async def test_sync_hands_an_envelope_on_only_once_committed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(max_concurrent_spawns=1)
    async with (
        SqliteStore(path, busy_timeout=0.05) as store,
        SubagentManager([AgentSpec(name="echo", runner=_echo)], config=config, store=store) as m,
    ):
        with write_locked(path):
            handle = m.spawn("echo", "a")
            follower = Finished()
            m.register(AgentSpec(name="next", runner=follower))
            m.spawn("next")
            with anyio.fail_after(10):
                await follower.started.wait()  # one slot: echo's run is over, finalized
            # Ended, not committed: nothing hands it on yet.
            assert not handle.done.is_set()
            assert handle.result is None
            assert m.result(handle.task_id) is None
            assert await m.wait_result(handle.task_id, timeout=0) is None
            assert store.mailbox("default").peek(handle.task_id) is None
            assert committed_end(path, handle.task_id) is None
        with anyio.fail_after(10):
            envelope = await handle.wait()
        # Handed on: the end is on disk, for any process to read.
        assert committed_end(path, handle.task_id) == "ended"
        assert envelope.output == "echo a"
        assert await m.wait_result(handle.task_id, timeout=0) == envelope


async def test_sync_wakes_mailbox_and_completion_waiters_only_once_committed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.db"
    config = SubagentConfig(max_concurrent_spawns=1)
    completed: list[str] = []
    async with (
        SqliteStore(path, busy_timeout=0.05) as store,
        SubagentManager([AgentSpec(name="echo", runner=_echo)], config=config, store=store) as m,
    ):
        m.events.subscribe(
            lambda event: completed.append(event.task_id) if event.type == COMPLETED else None
        )
        mailbox = m.mailbox()
        got: list[DelegateResult | None] = []
        # The waiter is the envelope's one consumer: it takes it once committed.
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def wait(task_id: str) -> None:
                    got.append(await mailbox.wait(task_id))

                with write_locked(path):
                    handle = m.spawn("echo", "b")
                    tg.start_soon(wait, handle.task_id)
                    follower = Finished()
                    m.register(AgentSpec(name="next", runner=follower))
                    m.spawn("next")
                    with anyio.fail_after(10):
                        await follower.started.wait()
                    assert mailbox.peek(handle.task_id) is None
                    assert handle.task_id not in completed
                    assert not got
        [envelope] = got
        assert envelope is not None
        assert envelope.output == "echo b"
        # The mailbox's put and the task's end may commit in two batches (the writer can
        # take its queue between the two submits), so the handle may settle one later.
        with anyio.fail_after(10):
            await handle.done.wait()
        assert handle.task_id in completed
        assert handle.collected  # taken from the mailbox: collected


async def test_async_hands_an_envelope_on_before_its_commit(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    config = SubagentConfig(durability="async")
    async with (
        SqliteStore(path, busy_timeout=0.05) as store,
        SubagentManager([AgentSpec(name="echo", runner=_echo)], config=config, store=store) as m,
    ):
        with write_locked(path):
            handle = m.spawn("echo", "c")
            with anyio.fail_after(10):
                envelope = await m.mailbox().wait(handle.task_id)  # the lock still held
            assert envelope is not None
            assert envelope.output == "echo c"
            assert handle.done.is_set()
            assert committed_end(path, handle.task_id) is None  # not even the spawn yet
        with anyio.fail_after(10):
            await store.wait_committed()
        assert committed_end(path, handle.task_id) == "ended"


async def test_a_store_failing_before_the_commit_still_hands_the_envelope_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_error(*args: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    path = tmp_path / "f.db"
    async with (
        SqliteStore(path) as store,
        SubagentManager([AgentSpec(name="echo", runner=_echo)], store=store) as m,
    ):
        monkeypatch.setattr(_deliveries, "insert", disk_error)
        handle = m.spawn("echo", "d")
        with anyio.fail_after(10):
            envelope = await m.mailbox().wait(handle.task_id)
        # The put was never committed: it is readable here, from memory, as put's are.
        assert envelope is not None
        assert envelope.status is Status.COMPLETED
        assert handle.done.is_set()
        assert await handle.wait() == envelope


async def test_a_crashing_writer_still_hands_every_envelope_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a write (anything but an SQLite error) crashes the writer thread: the
    writes of the batch in hand are failed like the queued ones, so no child waits for a
    commit that never comes."""

    def broken(cls: object, conn: object, writes: object) -> None:
        raise TypeError("a bug in a write")

    path = tmp_path / "c.db"
    async with (
        SqliteStore(path, busy_timeout=0.05) as store,
        SubagentManager([AgentSpec(name="echo", runner=_echo)], store=store) as m,
    ):
        monkeypatch.setattr(_journal_writes.EndWrite, "apply", classmethod(broken))
        handles = [m.spawn("echo", str(i)) for i in range(5)]
        with anyio.fail_after(10):
            outputs = [(await handle.wait()).output for handle in handles]
        assert outputs == [f"echo {i}" for i in range(5)]
        with pytest.raises(StoreError, match="the writer thread crashed"):
            await store.wait_committed()


async def test_text_a_store_cannot_encode_is_journaled_cleaned_or_refused(
    tmp_path: Path,
) -> None:
    """A lone surrogate in a spawn's texts is replaced in its journaled request (the row
    never fails its batch); an idempotency key, an identifier, is refused instead."""
    path = tmp_path / "u.db"
    async with (
        SqliteStore(path) as store,
        SubagentManager([AgentSpec(name="echo", runner=_echo)], store=store) as m,
    ):
        with pytest.raises(ValueError, match="idempotency_key must be a non-empty string"):
            m.spawn("echo", "x", idempotency_key="k\ud800")
        handle = m.spawn("echo", "lone \ud800 surrogate")
        await handle.journaled()
        assert (await handle.wait()).status is Status.COMPLETED
        assert (await m.spawn("echo", "fine").wait()).output == "echo fine"
    with sqlite(path) as conn:
        (request,) = conn.execute(
            "SELECT request FROM tasks WHERE task_id = ?", (handle.task_id,)
        ).fetchone()
    assert "lone ? surrogate" in bytes(request).decode()


@pytest.mark.parametrize("durability", ["sync", "async"])
async def test_capacity_counts_envelopes_on_their_way_to_the_store(
    tmp_path: Path, durability: str
) -> None:
    """Children ending in one batch do not overfill their mailbox: a put_durable counts
    from the moment it is accepted; the rest go by the event (mailbox_full) and stay
    readable through their handles."""
    config = SubagentConfig(
        store_path=tmp_path / "cap.db",
        mailbox_capacity=4,
        durability=durability,  # type: ignore[arg-type]
        max_concurrent_spawns=20,
    )
    full: list[str] = []
    async with SubagentManager([AgentSpec(name="echo", runner=_echo)], config=config) as m:
        m.events.subscribe(
            lambda event: full.append(event.task_id) if event.type == MAILBOX_FULL else None
        )
        handles = [m.spawn("echo", str(i)) for i in range(20)]
        with anyio.fail_after(10):
            for handle in handles:
                await handle.done.wait()
        assert len(m.mailbox()) == 4
        assert len(full) == 16
        assert m.statistics().mailbox_overflows == 16
        for i, handle in enumerate(handles):  # nothing lost: every one answers
            envelope = await m.wait_result(handle.task_id, timeout=0)
            assert envelope is not None
            assert envelope.output == f"echo {i}"


async def test_a_raising_notifier_leaves_no_waiter_waiting(tmp_path: Path) -> None:
    """A custom notifier that raises as the commit hands an envelope on (logged by the
    store's callback) still lets the child's waiters go."""

    class Broken(CompletionNotifier):
        def announce(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("announce broke")

    managers: list[SubagentManager] = []
    notifier = Broken(lambda session: managers[0].mailbox(session))
    async with SqliteStore(tmp_path / "n.db") as store:
        managers.append(
            SubagentManager([AgentSpec(name="echo", runner=_echo)], store=store, notifier=notifier)
        )
        async with managers[0] as m:
            handle = m.spawn("echo", "x")
            with anyio.fail_after(10):
                assert (await handle.wait()).output == "echo x"


async def test_a_commit_before_the_watcher_thread_first_runs_still_wakes_a_waiter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version the watcher compares with is read as the store opens, not when its
    thread first gets to run: read late, it would already hold another connection's
    commit made after a waiter looked, and that commit would never wake it."""
    late = threading.Event()
    run = _watch.Watcher._run

    def runs_late(self: _watch.Watcher) -> None:
        late.wait(30)  # a loaded machine: the thread first runs after the commit below
        run(self)

    monkeypatch.setattr(_watch.Watcher, "_run", runs_late)
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        woke = anyio.Event()
        box = store.mailbox("root")
        assert box.subscribe_once("t", woke.set) is not None  # looked: nothing there
        async with SqliteStore(path) as other:  # another process's, as far as SQLite sees
            other_box = other.mailbox("root")
            other_box.put("t", env("t"))
            await other_box.wait_committed()
            late.set()
        with anyio.fail_after(10):
            await woke.wait()
