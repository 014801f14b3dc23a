"""Cancelling ``SqliteMailbox.take_all``: before the writer takes the take into a
transaction it is withdrawn, nothing taken (also while another process holds the write
lock), and the puts it kept from being overwritten are overwritten after all; once in a
transaction, its caller gets what it took and the cancellation at its next checkpoint,
whether an anyio scope or asyncio's own ``task.cancel()`` asked for it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents import DelegateResult
from subagents.store import SqliteStore
from subagents.store import _deliveries as deliveries
from tests.store.support import env, sqlite, write_locked
from tests.store.test_store_lifecycle import writer_parked

pytestmark = pytest.mark.anyio


def claims_held(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """``(applying, go)``: a take's claim in the writer's transaction sets ``applying`` and
    waits for ``go``."""
    applying, go = threading.Event(), threading.Event()
    claim_ids = deliveries.claim_ids

    def held(*args: Any, **kwargs: Any) -> list[tuple[str, int, int]]:
        applying.set()
        go.wait(10)
        return claim_ids(*args, **kwargs)

    monkeypatch.setattr(deliveries, "claim_ids", held)
    return applying, go


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
        applying, go = claims_held(monkeypatch)
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


async def test_a_deadline_in_the_takes_transaction_returns_what_it_took_and_cancels_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        await box.wait_committed()
        applying, go = claims_held(monkeypatch)
        got: list[DelegateResult] = []
        steps: list[str] = []
        scope = anyio.CancelScope()

        async def take() -> None:
            with scope:
                got.extend(await box.take_all())
                steps.append("returned")
                await anyio.lowlevel.checkpoint()
                steps.append("went on")
            await anyio.lowlevel.checkpoint()  # nothing stray past the scope
            steps.append("after the scope")

        async with anyio.create_task_group() as tg:
            tg.start_soon(take)
            assert await anyio.to_thread.run_sync(applying.wait, 10)
            scope.deadline = anyio.current_time()  # passes while the writer applies the take
            await anyio.wait_all_tasks_blocked()
            go.set()
        assert scope.cancelled_caught
        assert got == [env("a")]
        assert steps == ["returned", "after the scope"]


async def native_take(box: Any, got: list[DelegateResult], steps: list[str]) -> None:
    got.extend(await box.take_all())
    steps.append("returned")
    await asyncio.sleep(0)
    steps.append("went on")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("cancels", [1, 2])
async def test_asyncio_task_cancel_in_the_takes_transaction_is_raised_after_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cancels: int
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        await box.wait_committed()
        applying, go = claims_held(monkeypatch)
        got: list[DelegateResult] = []
        steps: list[str] = []
        task = asyncio.ensure_future(native_take(box, got, steps))
        try:
            assert await anyio.to_thread.run_sync(applying.wait, 10)
            for _ in range(cancels):  # a second one while it waits, shielded, for the commit
                task.cancel()
                await asyncio.sleep(0)
        finally:
            go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert got == [env("a")]
        assert steps == ["returned"]
        assert box.drain_all() == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_asyncio_timeout_in_the_takes_transaction_still_raises_timeout_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        await box.wait_committed()
        applying, go = claims_held(monkeypatch)
        got: list[DelegateResult] = []

        timeout = asyncio.timeout(None)

        async def take() -> None:
            async with timeout:
                got.extend(await box.take_all())
                await asyncio.sleep(0)

        task = asyncio.ensure_future(take())
        try:
            assert await anyio.to_thread.run_sync(applying.wait, 10)
            timeout.reschedule(asyncio.get_running_loop().time())  # passes in the transaction
            await asyncio.sleep(0)
        finally:
            go.set()
        with pytest.raises(TimeoutError):
            await task
        assert got == [env("a")]


def written(path: Path) -> list[tuple[str, str]]:
    with sqlite(path) as conn:
        rows = conn.execute("SELECT task_id, state FROM deliveries ORDER BY id").fetchall()
        return [(str(task_id), str(state)) for task_id, state in rows]


@pytest.mark.parametrize("overwrite", ["before the cancel", "after the cancel"])
async def test_a_put_a_withdrawn_take_kept_is_overwritten_after_all(
    tmp_path: Path, overwrite: str
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        box = store.mailbox("s")
        reported: list[str] = []
        box.committed = lambda envelope: reported.append(envelope.output)
        scope = anyio.CancelScope()

        async def take() -> None:
            with scope:
                await box.take_all()

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                box.put("a", env("a", "old"))
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()
                if overwrite == "before the cancel":
                    box.put("a", env("a", "new"))  # kept for the take
                scope.cancel()  # withdrawn: nothing taken
                await anyio.wait_all_tasks_blocked()
                if overwrite == "after the cancel":
                    box.put("a", env("a", "new"))
        await box.wait_committed()
        assert box.drain_all() == [env("a", "new")]
    assert reported == ["new"]  # "old" was never written
    assert written(path) == [("a", "read")]
