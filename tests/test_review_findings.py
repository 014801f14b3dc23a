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
