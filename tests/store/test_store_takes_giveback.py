"""What a take cancelled by asyncio's own ``task.cancel()`` in its transaction gives back:
counted against the capacity once (from the take's commit until its own), its ids still
the mailbox's to replace, waking every mailbox object of the session (the one that put it
too), and given back even while the store closes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents import DelegateResult, MailboxFull
from subagents.store import SqliteMailbox, SqliteStore, _takes
from subagents.store import _deliveries as deliveries
from subagents.store import _writer as writer_module
from tests.store.support import block_the_loop_until_the_watermark_moves, env
from tests.store.test_store_lifecycle import writer_parked
from tests.store.test_store_takes_cancel import claims_held

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def cancelled_in_its_transaction(
    box: SqliteMailbox, monkeypatch: pytest.MonkeyPatch
) -> tuple[asyncio.Future[list[DelegateResult]], threading.Event]:
    """A ``take_all`` cancelled by ``task.cancel()`` while the writer applies it (held
    there until the event returned is set)."""
    applying, go = claims_held(monkeypatch)
    task = asyncio.ensure_future(box.take_all())
    assert await anyio.to_thread.run_sync(applying.wait, 10)
    task.cancel()
    await asyncio.sleep(0)
    return task, go


async def test_what_is_given_back_counts_against_the_capacity_until_it_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s", capacity=2)
        box.put("a", env("a"))
        box.put("b", env("b"))
        await box.wait_committed()
        task, go = await cancelled_in_its_transaction(box, monkeypatch)
        with writer_parked(store):  # the give-back waits in the writer's queue
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert len(box) == 2
            with pytest.raises(MailboxFull):
                box.put("c", env("c"))
        assert await box.take_all() == [env("a"), env("b")]


async def test_a_give_back_wakes_every_object_of_the_session_the_one_that_put_it_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        putter, taker, third = (store.mailbox("s") for _ in range(3))
        putter.put("a", env("a"))
        await putter.wait_committed()
        woken = {name: anyio.Event() for name in ("putter", "third")}
        putter.subscribe_all(woken["putter"].set)
        third.subscribe_all(woken["third"].set)
        task, go = await cancelled_in_its_transaction(taker, monkeypatch)
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        with anyio.fail_after(10):  # the watcher looks again at the give-back's commit
            for event in woken.values():
                await event.wait()
        assert putter.peek("a") == env("a")


async def test_a_store_closing_meanwhile_still_commits_the_give_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    await store.__aenter__()
    box = store.mailbox("s")
    box.put("a", env("a"))
    await box.wait_committed()
    task, go = await cancelled_in_its_transaction(box, monkeypatch)
    closing: asyncio.Future[Any] = asyncio.ensure_future(store.aclose())
    await asyncio.sleep(0)  # the mailboxes dropped, the writer asked to stop
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await closing
    async with SqliteStore(path) as again:
        assert await again.mailbox("s").take_all() == [env("a")]


async def test_a_give_back_committed_before_its_callback_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s", capacity=3)
        box.put("a", env("a"))
        box.put("b", env("b"))
        await box.wait_committed()
        task, go = await cancelled_in_its_transaction(box, monkeypatch)
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        block_the_loop_until_the_watermark_moves(store)
        assert len(box) == 2
        box.put("c", env("c"))  # room for one more


async def test_a_take_applied_but_not_committed_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    applied, go = threading.Event(), threading.Event()
    apply = _takes.TakeAll.apply.__func__  # type: ignore[attr-defined]

    def held(cls: Any, conn: Any, writes: Any) -> None:
        apply(cls, conn, writes)
        applied.set()
        go.wait(10)

    monkeypatch.setattr(_takes.TakeAll, "apply", classmethod(held))
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s", capacity=3)
        box.put("a", env("a"))
        box.put("b", env("b"))
        await box.wait_committed()
        task = asyncio.ensure_future(box.take_all())
        try:
            assert await anyio.to_thread.run_sync(applied.wait, 10)
            task.cancel()
            await asyncio.sleep(0)
            assert len(box) == 2  # the take's rows, still stored to the loop's reads
        finally:
            go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await box.take_all() == [env("a"), env("b")]


async def test_a_put_of_an_id_being_given_back_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s", capacity=1)
        box.put("a", env("a"))
        await box.wait_committed()
        task, go = await cancelled_in_its_transaction(box, monkeypatch)
        with writer_parked(store):
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            box.put("a", env("a", "again"))  # one entry, not two: no MailboxFull
        assert await box.take_all() == [env("a", "again")]  # after the give-back: newer


async def test_a_give_back_makes_the_sessions_tally_count_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        a, b = store.mailbox("s", capacity=2), store.mailbox("s", capacity=2)
        a.put("x", env("x"))
        a.put("y", env("y"))
        await a.wait_committed()
        task, go = await cancelled_in_its_transaction(a, monkeypatch)
        with writer_parked(store):
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            b.put("z", env("z"))  # soft across objects: accepted while "x", "y" are away
        later = store.mailbox("other")
        later.put("q", env("q"))  # reported after the give-back, in order
        await later.wait_committed()
        assert len(a) == 3
        with pytest.raises(MailboxFull):
            a.put("w", env("w"))


async def test_taken_rows_count_between_the_takes_commit_and_the_writers_watermark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread has run COMMIT (the rows read in the database) but not yet set
    ``writer.committed`` (it waits for the GIL; held there here)."""
    claimed, go, committed, resume = (threading.Event() for _ in range(4))
    claim_ids = deliveries.claim_ids

    def held(*args: Any, **kwargs: Any) -> Any:
        claimed.set()
        go.wait(10)
        return claim_ids(*args, **kwargs)

    monkeypatch.setattr(deliveries, "claim_ids", held)
    orig = writer_module.immediate

    @contextmanager
    def slow(raw: Any) -> Iterator[None]:
        with orig(raw):
            yield
        if claimed.is_set() and not committed.is_set():
            committed.set()  # COMMIT done, watermark not yet set
            resume.wait(10)

    monkeypatch.setattr(writer_module, "immediate", slow)
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s", capacity=2)
        box.put("a", env("a"))
        box.put("b", env("b"))
        await box.wait_committed()
        task = asyncio.ensure_future(box.take_all())
        assert await anyio.to_thread.run_sync(claimed.wait, 10)
        task.cancel()
        await asyncio.sleep(0)  # cancelled in its transaction: a give-back is made
        go.set()
        assert await anyio.to_thread.run_sync(committed.wait, 10)
        try:
            n = len(box)
            accepted = []
            for k in ("c", "d"):
                try:
                    box.put(k, env(k))
                    accepted.append(k)
                except MailboxFull:
                    pass
        finally:
            resume.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        later = store.mailbox("other")
        later.put("q", env("q"))  # reported after the give-back, in order
        await later.wait_committed()
        assert (n, accepted, len(box)) == (2, [], 2)


async def test_an_id_given_back_then_put_and_consumed_here_counts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s", capacity=1)
        box.put("a", env("a"))
        await box.wait_committed()
        task, go = await cancelled_in_its_transaction(box, monkeypatch)
        with writer_parked(store):
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            box.put("a", env("a", "again"))
            assert box.drain("a") == env("a", "again")  # the newest, consumed here
            assert box.peek("a") is None
            assert len(box) == 0  # the give-back of "a" is retired by the put's insert
            box.put("b", env("b"))
        await box.wait_committed()
        assert len(box) == 1


async def test_subscriptions_made_before_the_give_back_commits_fire_at_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        other = store.mailbox("s")
        box.put("a", env("a"))
        await box.wait_committed()
        task, go = await cancelled_in_its_transaction(box, monkeypatch)
        fired, fired2 = anyio.Event(), anyio.Event()
        with writer_parked(store):
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert box.peek("a") is None
            assert box.drain("a") is None
            assert box.subscribe_once("a", fired.set) is not None
            assert other.subscribe_once("a", fired2.set) is not None
        with anyio.fail_after(10):
            await fired.wait()
            await fired2.wait()
            assert await box.wait("a") == env("a")
