"""Cancelling ``SqliteMailbox.take_all``: before the writer takes the take into a
transaction it is withdrawn, nothing taken (also while another process holds the write
lock), and the puts it kept from being overwritten are overwritten after all; once in a
transaction, a cancelled anyio or trio scope gets what it took and raises at its next
checkpoint, while asyncio's own cancellation (``task.cancel()``, ``asyncio.timeout``, a
``TaskGroup``'s) is raised at once, as asyncio promises, and what was taken is unread again."""

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


async def _cancel_once(task: asyncio.Task[Any]) -> None:
    task.cancel()


async def _cancel_twice(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.sleep(0)  # a second one while it waits, shielded, for the commit
    task.cancel()


NATIVE = {"task.cancel()": _cancel_once, "task.cancel() twice": _cancel_twice}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("how", sorted(NATIVE))
async def test_asyncio_task_cancel_in_the_takes_transaction_raises_and_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        await box.wait_committed()
        applying, go = claims_held(monkeypatch)
        task = asyncio.ensure_future(box.take_all())  # a task that ends with the take
        try:
            assert await anyio.to_thread.run_sync(applying.wait, 10)
            await NATIVE[how](task)
            await asyncio.sleep(0)
        finally:
            go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await box.take_all() == [env("a")]  # unread again, for the next taker


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_what_a_cancelled_take_took_is_not_given_back_over_a_newer_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a", "old"))
        box.put("b", env("b"))
        await box.wait_committed()
        applying, go = claims_held(monkeypatch)
        task = asyncio.ensure_future(box.take_all())
        try:
            assert await anyio.to_thread.run_sync(applying.wait, 10)
            box.put("a", env("a", "new"))  # after the take's call: written after it
            task.cancel()
            await asyncio.sleep(0)
        finally:
            go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        # "b" is unread again, arrived anew (after "new"); "old" stays overwritten.
        assert await box.take_all() == [env("a", "new"), env("b")]


class Canceller:
    """What cancels a consumer natively, once :meth:`fire` is called."""

    def __init__(self) -> None:
        self.timeout: asyncio.Timeout | None = None
        self.failing = asyncio.Event()

    def fire(self) -> None:
        if self.timeout is not None:
            self.timeout.reschedule(asyncio.get_running_loop().time())
        self.failing.set()


async def _in_a_timeout(box: Any, canceller: Canceller, steps: list[str]) -> None:
    try:
        async with asyncio.timeout(None) as canceller.timeout:
            await box.take_all()
            steps.append("returned")
    except TimeoutError:
        steps.append("TimeoutError")


async def _in_a_task_group(box: Any, canceller: Canceller, steps: list[str]) -> None:
    async def fail() -> None:
        await canceller.failing.wait()
        raise ValueError("a sibling failed")

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(fail())
            await box.take_all()
            steps.append("returned")
    except* ValueError:
        steps.append("ValueError")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    ("way", "raised"),
    [(_in_a_timeout, "TimeoutError"), (_in_a_task_group, "ValueError")],
    ids=["asyncio.timeout", "asyncio.TaskGroup"],
)
async def test_asyncio_s_own_cancellers_in_the_takes_transaction_raise_as_they_promise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: Any, raised: str
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        await box.wait_committed()
        applying, go = claims_held(monkeypatch)
        canceller = Canceller()
        steps: list[str] = []

        async def consumer() -> None:
            await way(box, canceller, steps)
            steps.append("after the block")
            await asyncio.sleep(0)  # nothing cancels this task any more
            steps.append("went on")

        task = asyncio.ensure_future(consumer())
        try:
            assert await anyio.to_thread.run_sync(applying.wait, 10)
            canceller.fire()
            # The cancellation lands: the take waits, shielded, for the commit held back.
            await anyio.wait_all_tasks_blocked()
        finally:
            go.set()
        await task
        assert steps == [raised, "after the block", "went on"]
        assert await box.take_all() == [env("a")]


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
