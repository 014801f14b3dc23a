"""Slot lending under concurrent waits, enclosing cancellation and shutdown.

A child blocked on its own children lends its slot (``lend_slot``) and takes one back
before it runs on. These tests build the interleavings where that bookkeeping is easiest to
get wrong: several tasks of one child waiting at once, an ``execute()`` delegate cancelled
by a scope of its caller's while its grandchildren hold every slot, and ``aclose()`` with
children that ignore cancellation while others lend or wait to resume.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from subagents import Event, Request, RunContext, SubagentManager

from .support import completed_events, make_manager, recorded

pytestmark = pytest.mark.anyio


async def _until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not predicate():
            await anyio.wait_all_tasks_blocked()
            if not predicate():
                await anyio.sleep(0.001)


def _check_accounting(manager: SubagentManager, samples: list[int]) -> None:
    """The counters sampled from the runners and at the end are within the limit."""
    stats = manager.statistics()
    assert samples, "no runner sampled the counters"
    assert all(0 <= running <= stats.limit for running in samples), samples
    assert stats.high_water <= stats.limit
    assert stats.running == 0
    assert stats.settled == stats.spawned
    assert not manager._resumers


def _check_one_envelope_each(manager: SubagentManager, events: list[Event]) -> None:
    for handle in manager._tasks.values():
        assert handle.result is not None, handle
        assert len(completed_events(events, handle.task_id)) == 1, handle
        assert handle._lends == 0
        assert not handle._holds_slot


# ------------------------------------------------------------------ 1. sibling waits


@pytest.mark.parametrize("limit", [1, 2])
async def test_sibling_tasks_of_one_child_waiting_at_once_keep_the_accounting(limit: int) -> None:
    """Six tasks of one child each wait on a grandchild at once (all lending the child's one
    slot): the counters never leave [0, limit], nothing deadlocks (a task whose wait ends
    while its siblings still wait must not take the slot back and keep it from them), and
    every spawn ends in one envelope."""
    samples: list[int] = []

    async def leaf(request: Request, ctx: RunContext) -> str:
        samples.append(ctx.manager.statistics().running)
        await anyio.lowlevel.checkpoint()
        samples.append(ctx.manager.statistics().running)
        return request.input

    async def parent(request: Request, ctx: RunContext) -> str:
        outputs: list[str] = []

        async def one(index: int) -> None:
            handle = ctx.spawn("leaf", str(index))
            if index % 2:
                envelope = await handle.wait()
            else:
                waited = await ctx.wait(handle.task_id)
                assert waited is not None
                envelope = waited
            samples.append(ctx.manager.statistics().running)
            outputs.append(envelope.output)

        async with anyio.create_task_group() as tg:
            for index in range(6):
                tg.start_soon(one, index)
        samples.append(ctx.manager.statistics().running)
        return ",".join(sorted(outputs))

    manager = make_manager({"leaf": leaf, "parent": parent}, limit=limit, spawn_timeout=30)
    async with manager:
        with recorded(manager) as events, anyio.fail_after(10):
            envelope = await manager.spawn("parent").wait()
        assert envelope.status == "completed", envelope
        assert envelope.output == "0,1,2,3,4,5"
        _check_accounting(manager, samples)
        _check_one_envelope_each(manager, events)


async def test_a_wait_starting_while_its_sibling_waits_for_the_slot_lends_too() -> None:
    """Task A of a child ends its wait but finds the only slot taken (it waits to resume);
    meanwhile task B of the same child starts waiting on a new grandchild. B's wait must lend
    the slot A is about to take back: before, B's wait lent nothing (the child held no slot
    at that instant), A resumed holding the slot and ended, and B's grandchild stayed queued
    behind its own parent's slot forever."""
    samples: list[int] = []
    hold = anyio.Event()
    b_go = anyio.Event()

    async def leaf(request: Request, ctx: RunContext) -> str:
        samples.append(ctx.manager.statistics().running)
        return request.input

    async def blocker(request: Request, ctx: RunContext) -> str:
        samples.append(ctx.manager.statistics().running)
        await hold.wait()
        return "blocker"

    async def parent(request: Request, ctx: RunContext) -> str:
        async def a() -> None:
            first = ctx.spawn("leaf", "g1")
            ctx.spawn("blocker")  # queued behind g1: takes the slot the moment g1 frees it
            await first.wait()
            samples.append(ctx.manager.statistics().running)

        async def b() -> str:
            await b_go.wait()
            return (await ctx.spawn("leaf", "g2").wait()).output

        outputs: list[str] = []

        async def run_b() -> None:
            outputs.append(await b())

        async with anyio.create_task_group() as tg:
            tg.start_soon(a)
            tg.start_soon(run_b)
        samples.append(ctx.manager.statistics().running)
        return outputs[0]

    manager = make_manager(
        {"leaf": leaf, "blocker": blocker, "parent": parent}, limit=1, spawn_timeout=30
    )
    async with manager:
        with recorded(manager) as events:
            handle = manager.spawn("parent")
            await _until(lambda: len(manager._resumers) == 1)  # A waits to take a slot back
            b_go.set()
            await anyio.wait_all_tasks_blocked()  # B is waiting on g2 (queued)
            hold.set()
            with anyio.fail_after(5):
                envelope = await handle.wait()
        assert envelope.status == "completed", envelope
        assert envelope.output == "g2"
        _check_accounting(manager, samples)
        _check_one_envelope_each(manager, events)
