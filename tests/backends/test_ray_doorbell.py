"""The doorbell that carries Ray's completions into the driver's event loop (the Ray
backend's bridge), without ray: what it does with completions once its loop is gone."""

from __future__ import annotations

import asyncio
import gc
import weakref
from concurrent.futures import Future

import anyio

from subagents.backends._ray_bridge import done_event


def test_a_completion_after_the_loop_closed_with_a_hand_over_queued_is_dropped() -> None:
    # The loop stops (run_until_complete returned) with waits abandoned; a completion
    # then queues the doorbell's answer into the stopped loop, which closes without
    # running it. A later completion must be dropped as after any ended loop, not kept
    # on the doorbell (with the event it would set) for as long as another call that
    # has not answered holds the doorbell.
    loop = asyncio.new_event_loop()
    rings: Future[int] = Future()
    late: Future[int] = Future()
    running: Future[int] = Future()  # a call still out on the cluster
    events: list[weakref.ref[anyio.Event]] = []

    async def abandon(late: Future[int], running: Future[int]) -> None:
        with anyio.move_on_after(0):
            await done_event(rings).wait()
        events.append(weakref.ref(done_event(late)))
        done_event(running)

    loop.run_until_complete(abandon(late, running))
    rings.set_result(1)  # queued into the stopped loop, never answered
    loop.close()
    late.set_result(2)
    del late  # done: only the doorbell could still hold its event
    gc.collect()
    assert events[0]() is None, "the doorbell of a closed loop keeps a late completion"
    assert not running.done()
