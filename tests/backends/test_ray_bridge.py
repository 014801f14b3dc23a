"""Waiting on a concurrent future from anyio (the Ray backend's bridge), without ray: the
futures are completed by plain threads, as Ray's own thread completes ``ObjectRef.future()``."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anyio
import pytest

from subagents.backends import _ray_bridge
from subagents.backends._ray_bridge import finished, settled

pytestmark = pytest.mark.anyio


def complete_later(future: Future[int], value: int, started: threading.Event) -> threading.Thread:
    """A thread that completes ``future`` once ``started`` is set (the waiter is waiting)."""

    def run() -> None:
        started.wait()
        future.set_result(value)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def test_a_future_completed_by_another_thread_wakes_its_waiter() -> None:
    future: Future[int] = Future()
    go = threading.Event()
    thread = complete_later(future, 42, go)
    async with anyio.create_task_group() as tg:
        result: list[int] = []

        async def wait() -> None:
            result.append(await settled(future))

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        go.set()
    thread.join()
    assert result == [42]


async def test_a_failed_future_raises_its_exception() -> None:
    future: Future[int] = Future()
    future.set_exception(ValueError("remote failure"))
    with pytest.raises(ValueError, match="remote failure"):
        await settled(future)


async def test_many_futures_completed_at_once_each_wake_their_waiter() -> None:
    futures: list[Future[int]] = [Future() for _ in range(200)]
    results: dict[int, int] = {}

    async def wait(n: int) -> None:
        results[n] = await settled(futures[n])

    with ThreadPoolExecutor(4) as pool:
        async with anyio.create_task_group() as tg:
            for n in range(len(futures)):
                tg.start_soon(wait, n)
            await anyio.wait_all_tasks_blocked()
            for n, future in enumerate(futures):
                pool.submit(future.set_result, n * 2)
    assert results == {n: n * 2 for n in range(200)}


async def test_a_waiter_can_be_cancelled_and_the_late_completion_is_harmless() -> None:
    future: Future[int] = Future()
    with anyio.move_on_after(0):
        await finished(future)
    future.set_result(1)  # its callback wakes nobody, and must not raise
    # The doorbell carries calls in order: once a later one has woken us, the first was
    # run (and none is left for this loop once the test ends).
    later: Future[int] = Future()
    async with anyio.create_task_group() as tg:
        tg.start_soon(settled, later)
        await anyio.wait_all_tasks_blocked()
        later.set_result(2)


def test_a_completion_after_the_event_loop_ended_is_dropped(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    future: Future[int] = Future()

    async def abandon() -> None:
        with anyio.move_on_after(0.01):
            await finished(future)

    anyio.run(abandon, backend=anyio_backend)
    with caplog.at_level(logging.DEBUG):
        future.set_result(1)  # the loop is gone: the hand-over fails, and the call is dropped
    # concurrent.futures logs, never raises, what a done-callback raises: the log is the
    # only place a failed hand-over would show.
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_completions_before_the_loop_answers_share_one_hand_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: list[object] = []
    original = _ray_bridge._hand_over

    def counting(token: object, call: object) -> bool:
        handed.append(call)
        return original(token, call)  # type: ignore[arg-type]

    monkeypatch.setattr(_ray_bridge, "_hand_over", counting)
    futures: list[Future[int]] = [Future() for _ in range(100)]
    results: dict[int, int] = {}

    async def wait(n: int) -> None:
        results[n] = await settled(futures[n])

    async with anyio.create_task_group() as tg:
        for n in range(len(futures)):
            tg.start_soon(wait, n)
        await anyio.wait_all_tasks_blocked()
        threads = threading.active_count()
        # One thread completes them all while the loop is held here, as Ray's delivers a
        # burst of replies: each callback runs in that thread, and starts none of its own.
        completer = threading.Thread(target=lambda: [f.set_result(7) for f in futures])
        completer.start()
        completer.join()
        assert threading.active_count() == threads
    assert results == dict.fromkeys(range(100), 7)
    assert len(handed) == 1


def test_a_completion_queued_into_a_loop_that_then_closed_holds_no_thread() -> None:
    # The loop stops (run_until_complete returned) with a child's wait abandoned; the
    # late completion queues its call into the stopped loop, which then closes and drops
    # it: nothing may wait for that call's answer.
    loop = asyncio.new_event_loop()
    queued = threading.Event()
    original = loop.call_soon_threadsafe

    def call_soon_threadsafe(*args: Any, **kwargs: Any) -> Any:
        handle = original(*args, **kwargs)
        queued.set()
        return handle

    loop.call_soon_threadsafe = call_soon_threadsafe  # type: ignore[method-assign]
    future: Future[int] = Future()

    async def abandon() -> None:
        with anyio.move_on_after(0):
            await finished(future)

    loop.run_until_complete(abandon())
    before = set(threading.enumerate())
    completer = threading.Thread(target=future.set_result, args=(1,))
    completer.start()
    completer.join(timeout=10)
    assert not completer.is_alive(), "the completing thread waits on a stopped loop"
    assert queued.is_set()
    loop.close()
    assert set(threading.enumerate()) - before == set()
