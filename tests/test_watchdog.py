"""The watchdog part on its own: one task cancels each armed scope at its deadline.

Every test runs on trio's ``MockClock(autojump_threshold=0)``: deadlines are virtual
seconds, reached as soon as every task is blocked, so nothing sleeps in real time and the
assertions compare exact virtual times.
"""

from __future__ import annotations

import anyio
import pytest
from trio.testing import MockClock

from subagents._watchdog import Watchdog

pytestmark = pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock")],
)


async def _cancelled_at(watchdog: Watchdog, deadline: float) -> float:
    """Arm a fresh scope for ``deadline`` (seconds from now), wait in it, return when the
    watchdog cancelled it."""
    start = anyio.current_time()
    with anyio.CancelScope() as scope:
        watchdog.arm(scope, start + deadline)
        await anyio.sleep_forever()
    assert scope.cancelled_caught
    return anyio.current_time() - start


@pytest.mark.anyio
async def test_an_armed_scope_is_cancelled_at_its_deadline() -> None:
    watchdog = Watchdog()
    async with anyio.create_task_group() as tg:
        watchdog.start(tg)
        assert await _cancelled_at(watchdog, 7.5) == pytest.approx(7.5)
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_disarmed_scope_is_never_cancelled() -> None:
    watchdog = Watchdog()
    async with anyio.create_task_group() as tg:
        watchdog.start(tg)
        scope = anyio.CancelScope()
        watchdog.arm(scope, anyio.current_time() + 1)
        watchdog.disarm(scope)
        await anyio.sleep(5)  # well past the deadline, in virtual time
        assert not scope.cancel_called
        assert len(watchdog) == 0
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_an_earlier_deadline_armed_later_wakes_the_watchdog_in_time() -> None:
    watchdog = Watchdog()
    fired: dict[str, float] = {}

    async def watched(name: str, after: float) -> None:
        fired[name] = await _cancelled_at(watchdog, after)

    async with anyio.create_task_group() as tg:
        watchdog.start(tg)
        async with anyio.create_task_group() as children:
            children.start_soon(watched, "late", 100.0)
            await anyio.wait_all_tasks_blocked()  # the watchdog now sleeps until 100
            children.start_soon(watched, "early", 2.0)
        tg.cancel_scope.cancel()
    assert fired == {"late": pytest.approx(100.0), "early": pytest.approx(2.0)}


@pytest.mark.anyio
async def test_arming_a_scope_again_replaces_its_deadline() -> None:
    watchdog = Watchdog()
    async with anyio.create_task_group() as tg:
        watchdog.start(tg)
        start = anyio.current_time()
        with anyio.CancelScope() as scope:
            watchdog.arm(scope, start + 1)
            watchdog.arm(scope, start + 5)  # a worker's scope, re-armed for its next child
            await anyio.sleep_forever()
        assert anyio.current_time() - start == pytest.approx(5)
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_many_scopes_disarmed_in_time_keep_the_heap_small() -> None:
    watchdog = Watchdog()
    async with anyio.create_task_group() as tg:
        watchdog.start(tg)
        now = anyio.current_time()
        for _ in range(10_000):
            scope = anyio.CancelScope()
            watchdog.arm(scope, now + 180)
            watchdog.disarm(scope)
        assert len(watchdog) == 0
        # private: the heap's length is what the rebuild bounds; nothing public shows it.
        assert len(watchdog._heap) <= 2 * len(watchdog) + 64 + 1
        tg.cancel_scope.cancel()
