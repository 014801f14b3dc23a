"""Findings of the final review: each test failed before its fix (asyncio and trio)."""

from __future__ import annotations

import anyio
import pytest

from subagents import Request, RunContext
from tests.helpers import manager_with, spec

pytestmark = pytest.mark.anyio


async def _until(predicate: object) -> None:
    with anyio.fail_after(5):
        while not predicate():  # type: ignore[operator]
            await anyio.wait_all_tasks_blocked()
            if not predicate():  # type: ignore[operator]
                await anyio.sleep(0.001)


async def test_raising_the_limit_wakes_a_parent_waiting_to_resume() -> None:
    """A parent whose wait ended but found no free slot resumes as soon as the limit rises
    (before: it waited for the unrelated running child to end)."""
    gate = anyio.Event()
    resumed = anyio.Event()

    async def fast(request: Request, ctx: RunContext) -> str:
        return "fast"

    async def slow(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "slow"

    async def parent(request: Request, ctx: RunContext) -> str:
        first = ctx.spawn("fast")
        ctx.spawn("slow")  # takes the slot the moment `fast` frees it
        await first.wait()
        resumed.set()
        return "parent"

    manager = manager_with(
        spec("fast", fast), spec("slow", slow), spec("parent", parent), max_concurrent_spawns=1
    )
    async with manager:
        handle = manager.spawn("parent")
        await _until(lambda: len(manager._resumers) == 1)
        manager.set_max_concurrent_spawns(2)
        with anyio.fail_after(2):
            await resumed.wait()
            envelope = await handle.wait()
        assert envelope.status == "completed"
        assert manager.statistics().high_water <= 2
        gate.set()


async def test_cancelling_a_lending_parent_at_a_full_limit_cancels_its_subtree() -> None:
    """A parent cancelled while lending its slot to a child that never ends must not wait
    for that child to end on its own before it can take a slot back and settle."""

    async def forever(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        return "never"

    async def parent(request: Request, ctx: RunContext) -> str:
        await ctx.spawn("forever").wait()
        return "parent"

    manager = manager_with(
        spec("forever", forever), spec("parent", parent), max_concurrent_spawns=1, settle_timeout=30
    )
    async with manager:
        handle = manager.spawn("parent")
        await _until(lambda: manager.statistics().running == 1 and handle._lends == 1)
        assert handle.cancel()
        with anyio.fail_after(2):
            envelope = await handle.wait()
        assert envelope.status == "cancelled"
        (child,) = manager.tasks(handle.task_id)
        assert child.result is not None
        assert child.result.status == "cancelled"
        assert manager.statistics().running == 0


async def test_cancelling_a_lending_grandparent_settles_the_whole_chain() -> None:
    """Three lending levels at a limit of 1: cancelling the top settles all three quickly
    (not after settle_timeout, with the parent holding the slot its child needs)."""

    async def forever(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        return "never"

    async def middle(request: Request, ctx: RunContext) -> str:
        await ctx.spawn("forever").wait()
        return "middle"

    async def top(request: Request, ctx: RunContext) -> str:
        await ctx.spawn("middle").wait()
        return "top"

    manager = manager_with(
        spec("forever", forever),
        spec("middle", middle),
        spec("top", top),
        max_concurrent_spawns=1,
        settle_timeout=30,
    )
    async with manager:
        handle = manager.spawn("top")
        await _until(
            lambda: manager.statistics().spawned == 3 and manager.statistics().running == 1
        )
        await anyio.wait_all_tasks_blocked()
        assert handle.cancel()
        with anyio.fail_after(2):
            envelope = await handle.wait()
        assert envelope.status == "cancelled"
        assert manager.statistics().running == 0
        assert manager.statistics().settled == 3


async def test_an_execute_timing_out_while_lending_its_parents_slot_does_not_hang() -> None:
    """execute() inside a spawned child: the delegate waits on a child of its own (lending
    the spawned parent's slot, which that child takes at a limit of 1); the delegate's
    timeout must end it, not wait for the child holding the slot to end on its own."""

    async def forever(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        return "never"

    async def delegate(request: Request, ctx: RunContext) -> str:
        await ctx.spawn("forever").wait()
        return "delegate"

    async def parent(request: Request, ctx: RunContext) -> str:
        envelope = await ctx.execute("delegate", timeout=0.05)
        return envelope.status

    manager = manager_with(
        spec("forever", forever),
        spec("delegate", delegate),
        spec("parent", parent),
        max_concurrent_spawns=1,
        settle_timeout=30,
    )
    async with manager:
        with anyio.fail_after(3):
            envelope = await manager.spawn("parent").wait()
        assert envelope.status == "completed"
        assert envelope.output == "timeout"
        assert manager.statistics().running == 0


async def test_an_ending_child_settles_within_settle_timeout_though_its_slot_was_taken() -> None:
    """An ending child gives its slot up while its children settle; a queued child takes it.
    After settle_timeout the ending child is delivered without waiting for a slot back."""
    gate = anyio.Event()
    child_started = anyio.Event()

    async def stubborn(request: Request, ctx: RunContext) -> str:
        child_started.set()
        with anyio.CancelScope(shield=True):
            await gate.wait()  # ignores the cancellation of its parent's end
        return "stubborn"

    async def slow(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "slow"

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("stubborn")
        await child_started.wait()
        ctx.manager.spawn("slow")  # queued behind the full limit
        return "parent"

    manager = manager_with(
        spec("stubborn", stubborn),
        spec("slow", slow),
        spec("parent", parent),
        max_concurrent_spawns=2,
        settle_timeout=0.1,
    )
    async with manager:
        handle = manager.spawn("parent")
        with anyio.fail_after(3):
            envelope = await handle.wait()
        assert envelope.status == "completed"
        assert manager.statistics().high_water <= 2
        gate.set()
