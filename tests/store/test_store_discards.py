"""``SqliteMailbox.discard``: an entry consumed for nobody (the manager collecting a child
whose envelope it holds) without the event loop waiting for the database. Gone from this
process's reads at the call, its row marked read in the writer's next transaction, a put
the writer has not taken written as read instead, a later put of the id left alone, and
no wait for a write lock another process holds: ``wait_result`` and ``handle.wait()``
return at once where a take of their own would wait for the lock, then fail."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents import AgentSpec, DelegateResult, SubagentConfig, SubagentManager
from subagents.store import SqliteStore, StoreError
from subagents.store import _deliveries as deliveries
from tests.store.support import (
    block_the_loop_until_the_watermark_moves,
    committed_mailbox,
    env,
    sqlite,
    write_locked,
)
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
        box = await committed_mailbox(store, "a", "b")
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
        box = await committed_mailbox(store, "a")
        with write_locked(store_path):
            box.discard("a")  # a drain waits for the lock here, then raises locked
            assert box.peek("a") is None
        await box.wait_committed()  # the writer's retries get the lock once it is free
        assert states(store_path) == [("a", "output of a", "read")]


async def test_a_discard_on_a_closing_store_drains_instead(store_path: Path) -> None:
    async with SqliteStore(store_path) as store:
        box = await committed_mailbox(store, "a")
        store._writer.stop()  # closing: the writer takes no more writes
        box.discard("a")
        assert box.peek("a") is None
    assert states(store_path) == [("a", "output of a", "read")]


async def test_a_discard_marks_only_the_row_it_found_not_another_processes_later_put(
    store_path: Path,
) -> None:
    async with SqliteStore(store_path) as store, SqliteStore(store_path) as other:
        box, theirs = store.mailbox("s"), other.mailbox("s")
        box.put("a", env("a", "first"))
        await box.wait_committed()
        with writer_parked(store):
            box.discard("a")
            theirs.put("a", env("a", "second"))  # committed before the discard is
            await theirs.wait_committed()
        await box.wait_committed()
        assert [row for row in states(store_path) if row[2] == "stored"] == [
            ("a", "second", "stored")
        ]
        assert box.peek("a") == env("a", "second")


async def test_a_discard_leaves_another_objects_put_of_the_id_in_its_batch(
    store_path: Path,
) -> None:
    async with SqliteStore(store_path) as store:
        mine, yours = store.mailbox("s"), store.mailbox("s")
        mine.put("a", env("a", "first"))
        await mine.wait_committed()
        with writer_parked(store):
            yours.put("a", env("a", "second"))  # applied before the discard, in its batch
            mine.discard("a")  # of the row this object found: "first"
        await store.wait_committed()
        assert yours.peek("a") == env("a", "second")
    assert [row for row in states(store_path) if row[2] == "stored"] == [("a", "second", "stored")]


async def test_a_take_all_submitted_before_a_discard_leaves_it_the_entry(
    store_path: Path,
) -> None:
    async with SqliteStore(store_path) as store:
        box = await committed_mailbox(store, "a", "b")
        got: list[DelegateResult] = []

        async def take() -> None:
            got.extend(await box.take_all())

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()  # submitted, the writer parked
                box.discard("a")  # the manager hands a's envelope on: the take must not
        assert got == [env("b")]
        assert states(store_path) == [("a", "output of a", "read"), ("b", "output of b", "read")]


def claims_held(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """``(claimed, go)``: a take's claim in the writer's transaction sets ``claimed`` once it
    has claimed its rows, and waits for ``go``."""
    claimed, go = threading.Event(), threading.Event()
    claim_ids = deliveries.claim_ids

    def held(*args: Any, **kwargs: Any) -> list[tuple[str, int, int]]:
        taken = claim_ids(*args, **kwargs)
        claimed.set()
        go.wait(10)
        return taken

    monkeypatch.setattr(deliveries, "claim_ids", held)
    return claimed, go


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    "when",
    ["in the take's transaction", "with the give-back queued", "in the give-back's transaction"],
)
async def test_a_cancelled_take_gives_back_no_entry_discarded_since_it_was_asked(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    giving, gone = threading.Event(), threading.Event()
    give_back = deliveries.give_back

    def given_back_held(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
        given = give_back(*args, **kwargs)
        giving.set()  # the new rows are in the give-back's transaction, not committed
        gone.wait(10)
        return given

    async with SqliteStore(store_path) as store:
        box = await committed_mailbox(store, "a")
        claimed, go = claims_held(monkeypatch)
        task = asyncio.ensure_future(box.take_all())
        assert await anyio.to_thread.run_sync(claimed.wait, 10)
        if when == "in the give-back's transaction":
            monkeypatch.setattr(deliveries, "give_back", given_back_held)
            task.cancel()
            await anyio.wait_all_tasks_blocked()
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await anyio.to_thread.run_sync(giving.wait, 10)
            box.discard("a")  # no live row to see: the one given back is to be marked
            assert box.peek("a") is None
            gone.set()
        elif when == "in the take's transaction":
            box.discard("a")  # of the row the take holds, not committed yet
            task.cancel()  # asyncio's own: the take gives back what it took
            await anyio.wait_all_tasks_blocked()
            go.set()
            # The writer commits the take, then the discard alone, before the cancelled
            # task submits its give-back.
            block_the_loop_until_the_watermark_moves(store)
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            task.cancel()
            await anyio.wait_all_tasks_blocked()
            with writer_parked(store):  # the give-back waits in the writer's queue
                go.set()
                with pytest.raises(asyncio.CancelledError):
                    await task
                box.discard("a")  # the row is read: nothing to mark, nothing to give back
                assert len(box) == 0
        await store.wait_committed()
        assert box.peek("a") is None
    assert {state for _, _, state in states(store_path)} == {"read"}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("discarded", ["a", "b"], ids=["its row", "no entry"])
async def test_a_cancelled_take_gives_back_another_processes_later_row_of_a_discarded_id(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, discarded: str
) -> None:
    async with SqliteStore(store_path) as store, SqliteStore(store_path) as other:
        box = await committed_mailbox(store, "a")
        claimed, go = claims_held(monkeypatch)
        with writer_parked(store):
            task = asyncio.ensure_future(box.take_all())
            await anyio.wait_all_tasks_blocked()  # submitted, not applied
            box.discard(discarded)  # of "a"'s row, or of nothing
            theirs = other.mailbox("s")
            theirs.put("b", env("b", "theirs"))  # committed before the take applies
            if discarded == "a":
                theirs.put("a", env("a", "second"))  # a later row: not the discard's
            await theirs.wait_committed()
        assert await anyio.to_thread.run_sync(claimed.wait, 10)
        task.cancel()  # asyncio's own: the take gives back what it took
        await anyio.wait_all_tasks_blocked()
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.wait_committed()
        assert box.peek("b") == env("b", "theirs")  # nobody had it: given back
        if discarded == "a":
            assert box.peek("a") == env("a", "second")


def disk_error(*args: object) -> None:
    raise sqlite3.OperationalError("disk I/O error")


async def test_an_entry_discarded_before_the_store_failed_stays_consumed(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(store_path) as store:
        box = await committed_mailbox(store, "a")
        with writer_parked(store):
            box.discard("a")
            monkeypatch.setattr(deliveries, "insert", disk_error)
            box.put("b", env("b"))  # in the discard's batch, which fails
        with pytest.raises(StoreError):
            await box.wait_committed()
        assert box.peek("a") is None
        assert box.drain_all() == [env("b")]  # kept in memory, as a failed put is


async def test_a_discarded_envelope_is_let_go_of_in_memory(store_path: Path) -> None:
    async with SqliteStore(store_path) as store:
        box = await committed_mailbox(store, "a")
        box.discard("a")
        await box.wait_committed()  # the discard's callback has run by then
        assert box._in_hand._held == {}


async def test_a_waiter_of_a_discarded_id_gets_another_processes_later_put(
    store_path: Path,
) -> None:
    async with SqliteStore(store_path) as store, SqliteStore(store_path) as other:
        box = await committed_mailbox(store, "a")
        got: list[DelegateResult | None] = []

        async def waiter() -> None:
            got.append(await box.wait("a", timeout=30))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                with writer_parked(store):
                    box.discard("a")  # of the row committed above
                    tg.start_soon(waiter)
                    await anyio.wait_all_tasks_blocked()  # the id is hidden: it waits
                    theirs = other.mailbox("s")
                    theirs.put("a", env("a", "second"))  # a row that replaces that one
                    await theirs.wait_committed()
                    box._look_again()  # the watcher sees it: the waiter finds "a" hidden
                    await anyio.wait_all_tasks_blocked()
                # The discard commits, changing no row: nothing for the watcher to see.
        assert got == [env("a", "second")]


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
