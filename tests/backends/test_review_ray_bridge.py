"""Review of the Ray backend's bridge (no ray needed): a waker thread must not outlive
the event loop it serves."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import anyio

from subagents.backends._ray_bridge import finished

WAKER = "subagents-ray-waker"


def wakers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == WAKER}


def test_a_waker_whose_call_was_queued_into_a_loop_that_then_closed_ends() -> None:
    # The loop stops (run_until_complete returned) with a child's wait abandoned; the
    # late completion's waker queues its call into the stopped loop, which then closes
    # and drops it: the waker waits for that call's answer forever.
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
