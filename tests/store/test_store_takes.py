"""``SqliteMailbox.take_all``: the take is a write of the writer thread's batch, so the
event loop goes on while it waits; it takes the puts submitted before it and none after,
other processes' committed ones too, and a caller cancelled meanwhile still gets what it
took."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents import DelegateResult
from subagents.store import SqliteStore
from subagents.store import _deliveries as deliveries
from subagents.store import _store as store_module
from tests.store.support import env, write_locked
from tests.store.test_store_lifecycle import writer_parked
from tests.store.test_store_overlay import disk_error

pytestmark = pytest.mark.anyio


async def test_a_take_waits_for_the_writer_while_the_event_loop_goes_on(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        got: list[DelegateResult] = []
        ran = anyio.Event()

        async def take() -> None:
            got.extend(await box.take_all())

        async def other() -> None:
            ran.set()

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(other)  # another task runs while the take waits
                await ran.wait()
                assert got == []  # the writer has not committed the take
        assert got == [env("a")]
        assert box.drain_all() == []


async def test_a_take_takes_the_puts_before_it_and_none_after(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        got: list[DelegateResult] = []

        async def take() -> None:
            got.extend(await box.take_all())

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()  # the take is queued
                box.put("b", env("b"))  # after it, in the same batch
        assert got == [env("a")]
        assert box.drain_all() == [env("b")]


async def test_a_take_cancelled_before_the_writer_takes_it_takes_nothing(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        scope = anyio.CancelScope()
        ended = anyio.Event()

        async def take() -> None:
            with scope:
                await box.take_all()
                raise AssertionError("the take returned")
            ended.set()

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
                with anyio.fail_after(5):  # at once, the writer still parked
                    await ended.wait()
        assert scope.cancelled_caught
        assert box.drain_all() == [env("a")]


async def test_a_take_cancelled_in_its_transaction_returns_what_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        box.put("b", env("b"))
        await box.wait_committed()
        applying, go = threading.Event(), threading.Event()
        claim_ids = deliveries.claim_ids

        def held(*args: Any, **kwargs: Any) -> list[tuple[str, int, int]]:
            applying.set()
            go.wait()
            return claim_ids(*args, **kwargs)

        monkeypatch.setattr(deliveries, "claim_ids", held)
        got: list[DelegateResult] = []
        scope = anyio.CancelScope()

        async def take() -> None:
            with scope:
                got.extend(await box.take_all())
                await anyio.lowlevel.checkpoint()  # the cancellation lands here
                raise AssertionError("the cancelled scope went on")

        async with anyio.create_task_group() as tg:
            tg.start_soon(take)
            try:
                assert await anyio.to_thread.run_sync(applying.wait, 10)
                scope.cancel()
                await anyio.wait_all_tasks_blocked()
                assert got == []  # still waiting for the commit
            finally:
                go.set()
        assert scope.cancelled_caught
        assert got == [env("a"), env("b")]
        assert box.drain_all() == []


async def test_a_take_cancelled_while_another_process_holds_the_lock_returns_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path, busy_timeout=0.05) as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        await box.wait_committed()
        scope = anyio.CancelScope()
        ended = anyio.Event()

        async def take() -> None:
            with scope:
                await box.take_all()
            ended.set()

        async with anyio.create_task_group() as tg:
            with write_locked(path):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
                with anyio.fail_after(5):  # the writer is retrying the lock meanwhile
                    await ended.wait()
        assert scope.cancelled_caught
        assert await box.take_all() == [env("a")]


async def test_a_take_committed_after_its_store_gave_up_closing_still_returns_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as theirs:
        theirs.mailbox("s").put("a", env("a", "from the other store"))
    monkeypatch.setattr(store_module, "_CLOSE_MARGIN", 0.0)
    store = SqliteStore(path, busy_timeout=0.05)
    await store.__aenter__()
    box = store.mailbox("s")
    got: list[DelegateResult] = []
    ended = anyio.Event()

    async def take() -> None:
        got.extend(await box.take_all())
        ended.set()

    with caplog.at_level(logging.CRITICAL, logger="subagents.store"):
        async with anyio.create_task_group() as tg:
            with write_locked(path):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()
                await store.aclose()  # gives up on the writer, closes its connection
                assert got == []
            with anyio.fail_after(10):  # the writer commits the take once the lock is free
                await ended.wait()
    assert got == [env("a", "from the other store")]
    async with SqliteStore(path) as again:
        assert again.mailbox("s").drain_all() == []


async def test_a_put_replaced_after_a_take_was_submitted_is_taken_as_it_was(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a", "old"))
        await box.wait_committed()
        got: list[DelegateResult] = []

        async def take() -> None:
            got.extend(await box.take_all())

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                box.put("a", env("a", "new"))  # replaces old
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()  # the take is queued
                box.put("a", env("a", "newest"))  # after the take: not what it takes
                assert box.peek("a") == env("a", "newest")
        assert got == [env("a", "new")]
        assert box.drain_all() == [env("a", "newest")]


async def test_a_take_decodes_what_another_store_committed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as mine, SqliteStore(path) as theirs:
        put = theirs.mailbox("s")
        put.put("a", env("a", "from the other store"))
        await put.wait_committed()
        taker = mine.mailbox("s")
        consumed: list[str] = []
        taker.consumed = lambda envelope: consumed.append(envelope.task_id)
        assert await taker.take_all() == [env("a", "from the other store")]
        assert consumed == ["a"]
        assert await put.take_all() == []


async def test_a_durable_put_is_taken_with_its_commit(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        with writer_parked(store):
            box.put_durable("a", env("a"))
            assert box.drain_all() == []  # not readable before its commit
        assert await box.take_all() == [env("a")]
        assert box.drain_all() == []


async def test_a_take_after_the_store_failed_takes_what_it_kept_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        monkeypatch.setattr(deliveries, "insert", disk_error)
        with caplog.at_level(logging.CRITICAL, logger="subagents.store"):
            got: list[DelegateResult] = []

            async def take() -> None:
                got.extend(await box.take_all())

            async with anyio.create_task_group() as tg:
                with writer_parked(store):
                    box.put("a", env("a"))  # its batch fails, the take's with it
                    tg.start_soon(take)
                    await anyio.wait_all_tasks_blocked()
            assert got == [env("a")]
            assert await box.take_all() == []  # refused at once: drain_all answers
