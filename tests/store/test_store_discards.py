"""``SqliteMailbox.discard``: an entry consumed for nobody (the manager collecting a child
whose envelope it holds) without the event loop waiting for the database. Gone from this
process's reads at the call, its row marked read in the writer's next transaction, a put
the writer has not taken written as read instead, a later put of the id left alone, and
no wait for a write lock another process holds: ``wait_result`` and ``handle.wait()``
return at once where a take of their own would wait for the lock, then fail."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents import AgentSpec, SubagentConfig, SubagentManager
from subagents.store import SqliteStore
from subagents.store import _deliveries as deliveries
from tests.store.support import env, sqlite, write_locked
from tests.store.test_store_lifecycle import writer_parked

pytestmark = pytest.mark.anyio


def states(path: Path) -> list[tuple[str, str, str]]:
    """``(task_id, output, state)`` of every delivery row, in arrival order."""
    with sqlite(path) as conn:
        found = conn.execute(
            "SELECT d.task_id, json_extract(e.body, '$.output'), d.state FROM deliveries d "
            "JOIN envelopes e ON e.id = d.envelope_id ORDER BY d.id"
        ).fetchall()
    return [(task_id, output, state) for task_id, output, state in found]


@pytest.fixture
def store_path(tmp_path: Path, empty_store: Path) -> Path:
    path = tmp_path / "s.db"
    shutil.copy(empty_store, path)
    return path


async def test_a_discard_marks_the_row_read_in_the_writers_next_transaction(
    store_path: Path,
) -> None:
    async with SqliteStore(store_path) as store, SqliteStore(store_path) as other:
        box = store.mailbox("s")
        box.put("a", env("a"))
        box.put("b", env("b"))
        await box.wait_committed()
        with writer_parked(store) as go:
            box.discard("a")
            assert box.peek("a") is None
            assert box.drain("a") is None
            assert len(box) == 1
            assert states(store_path)[0] == ("a", "output of a", "stored")  # nothing written yet
            go.set()
            await box.wait_committed()
        assert states(store_path) == [("a", "output of a", "read"), ("b", "output of b", "stored")]
        assert other.mailbox("s").peek("a") is None  # as another process sees it
        assert await box.take_all() == [env("b")]


async def test_a_put_the_writer_has_not_taken_is_written_as_read(store_path: Path) -> None:
    async with SqliteStore(store_path) as store:
        box = store.mailbox("s")
        with writer_parked(store):
            box.put("a", env("a"))
            box.discard("a")
            submitted = store._writer.submitted
        await box.wait_committed()
        assert submitted == 1, "the discard of an untaken put was a write of its own"
        assert states(store_path) == [("a", "output of a", "read")]


async def test_a_put_after_a_discard_is_a_new_entry_even_in_its_batch(store_path: Path) -> None:
    async with SqliteStore(store_path) as store:
        box = store.mailbox("s")
        box.put("a", env("a", "first"))
        await box.wait_committed()
        with writer_parked(store):
            box.discard("a")
            box.put("a", env("a", "second"))  # the same batch as the discard
            assert box.peek("a") == env("a", "second")
        await box.wait_committed()
        assert states(store_path) == [("a", "first", "read"), ("a", "second", "stored")]
        assert await box.take_all() == [env("a", "second")]


async def test_a_discard_of_a_put_in_the_writers_transaction_waits_for_nothing(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inserting, go = threading.Event(), threading.Event()
    insert = deliveries.insert

    def held(*args: Any, **kwargs: Any) -> None:
        inserting.set()
        go.wait(10)
        insert(*args, **kwargs)

    monkeypatch.setattr(deliveries, "insert", held)
    async with SqliteStore(store_path) as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        # The writer's transaction holds the gate from now on.
        assert await anyio.to_thread.run_sync(inserting.wait, 10)
        box.discard("a")  # a drain would wait here, the loop blocked, for the commit
        assert box.peek("a") is None
        assert len(box) == 0
        box.put("b", env("b"))
        go.set()
        await box.wait_committed()
        assert states(store_path) == [("a", "output of a", "read"), ("b", "output of b", "stored")]
        assert await box.take_all() == [env("b")]


async def test_a_discard_while_another_process_holds_the_lock_returns_at_once(
    store_path: Path,
) -> None:
    async with SqliteStore(store_path, busy_timeout=0.05) as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        await box.wait_committed()
        with write_locked(store_path):
            box.discard("a")  # a drain waits for the lock here, then raises locked
            assert box.peek("a") is None
        await box.wait_committed()  # the writer's retries get the lock once it is free
        assert states(store_path) == [("a", "output of a", "read")]


async def test_a_discard_on_a_closing_store_drains_instead(store_path: Path) -> None:
    async with SqliteStore(store_path) as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        await box.wait_committed()
        store._writer.stop()  # closing: the writer takes no more writes
        box.discard("a")
        assert box.peek("a") is None
    assert states(store_path) == [("a", "output of a", "read")]


# ------------------------------------------------------------ the manager's collection


def noop_agent() -> AgentSpec:
    async def run(request: Any, ctx: Any) -> str:
        return "done"

    return AgentSpec(name="noop", runner=run)


async def test_wait_result_returns_while_another_process_holds_the_write_lock(
    store_path: Path,
) -> None:
    async with (
        SqliteStore(store_path, busy_timeout=0.05) as store,
        SubagentManager([noop_agent()], store=store) as manager,
    ):
        handles = [manager.spawn("noop", "x") for _ in range(2)]
        for handle in handles:
            await manager.wait_journaled(handle)
        await manager.wait_result(handles[0].task_id)  # both have ended by then
        assert handles[1].done
        with write_locked(store_path):
            first = await manager.wait_result(handles[1].task_id, timeout=0)
            second = await handles[1].wait()
        assert first is not None
        assert first == second
        assert handles[1].collected
        assert manager.mailbox().peek(handles[1].task_id) is None
        await manager.mailbox().wait_committed()
        unread = [row for row in states(store_path) if row[2] == "stored"]
        assert unread == []


async def test_what_wait_result_collected_is_not_delivered_again_after_a_restart(
    store_path: Path,
) -> None:
    config = SubagentConfig(store_path=str(store_path))
    async with SubagentManager([noop_agent()], config=config) as manager:
        collected = manager.spawn("noop", "x")
        kept = manager.spawn("noop", "y")
        await manager.wait_result(collected.task_id)
        await kept.done.wait()  # ended, its envelope left unread
    async with SubagentManager([noop_agent()], config=config) as manager:
        assert [e.task_id for e in manager.mailbox().drain_all()] == [kept.task_id]
