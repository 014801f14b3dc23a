"""Waiting on a concurrent future from anyio (the Ray backend's bridge), without ray: the
futures are completed by plain threads, as Ray's own thread completes ``ObjectRef.future()``."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anyio
import pytest

from subagents.backends._ray_bridge import finished, settled

pytestmark = pytest.mark.anyio

WAKER = "subagents-ray-waker"


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
    # The waker carries calls in order: once a later one has woken us, the first was run
    # (and none is left for this loop once the test ends).
    later: Future[int] = Future()
    async with anyio.create_task_group() as tg:
        tg.start_soon(settled, later)
        await anyio.wait_all_tasks_blocked()
        later.set_result(2)


def test_a_completion_after_the_event_loop_ended_is_dropped_and_the_waker_ends(
    anyio_backend: str,
) -> None:
    future: Future[int] = Future()

    async def abandon() -> None:
        with anyio.move_on_after(0.01):
            await finished(future)

    anyio.run(abandon, backend=anyio_backend)
    future.set_result(1)  # the loop is gone: the waker meets RunFinishedError
    for thread in [t for t in threading.enumerate() if t.name == WAKER]:
        thread.join(timeout=10)
        assert not thread.is_alive(), "a waker outlived its event loop"


def wakers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == WAKER}


def test_a_waker_whose_call_was_queued_into_a_loop_that_then_closed_ends() -> None:
    # The loop stops (run_until_complete returned) with a child's wait abandoned; the
    # late completion's waker queues its call into the stopped loop, which then closes
    # and drops it: the waker must not wait for that call's answer forever.
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
    before = wakers()
    future.set_result(1)
    assert queued.wait(timeout=10)
    loop.close()
    for thread in wakers() - before:
        thread.join(timeout=3)
        assert not thread.is_alive(), "a waker is blocked on a loop that has closed"
