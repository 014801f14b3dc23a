"""Slot lending under concurrent waits, enclosing cancellation and shutdown.

A child blocked on its own children lends its slot (``lend_slot``) and takes one back
before it runs on. These tests build the interleavings where that bookkeeping is easiest to
get wrong: several tasks of one child waiting at once, an ``execute()`` delegate cancelled
by a scope of its caller's while its grandchildren hold every slot, and ``aclose()`` with
children that ignore cancellation while others lend or wait to resume.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from subagents import DelegateResult, Event, Request, RunContext, SpawnHandle, SubagentManager
from tests.helpers import clock_backends, on_mock_clock

from .support import (
    completed_events,
    holds_no_slot,
    make_manager,
    recorded,
    records,
    waiting_to_resume,
)

pytestmark = pytest.mark.anyio


def _check_accounting(manager: SubagentManager, samples: list[int]) -> None:
    """The counters sampled from the runners and at the end are within the limit."""
    stats = manager.statistics()
    assert samples, "no runner sampled the counters"
    assert all(0 <= running <= stats.limit for running in samples), samples
    assert stats.high_water <= stats.limit
    assert stats.running == 0
    assert stats.settled == stats.spawned
    assert waiting_to_resume(manager) == 0


def _check_one_envelope_each(manager: SubagentManager, events: list[Event]) -> None:
    handles = records(manager)
    assert len(handles) == manager.statistics().spawned
    for handle in handles:
        assert handle.result is not None, handle
        assert len(completed_events(events, handle.task_id)) == 1, handle
        assert holds_no_slot(handle), handle


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
    blocking = anyio.Event()
    b_go = anyio.Event()

    async def leaf(request: Request, ctx: RunContext) -> str:
        samples.append(ctx.manager.statistics().running)
        return request.input

    async def blocker(request: Request, ctx: RunContext) -> str:
        samples.append(ctx.manager.statistics().running)
        blocking.set()
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
            with anyio.fail_after(5):
                await blocking.wait()  # g1 has ended: A's wait is over
            await anyio.wait_all_tasks_blocked()
            assert waiting_to_resume(manager) == 1  # A waits to take a slot back
            b_go.set()
            await anyio.wait_all_tasks_blocked()  # B is waiting on g2 (queued)
            hold.set()
            with anyio.fail_after(5):
                envelope = await handle.wait()
        assert envelope.status == "completed", envelope
        assert envelope.output == "g2"
        _check_accounting(manager, samples)
        _check_one_envelope_each(manager, events)


# ------------------------------------------------------------------ 2. execute() cancelled


@pytest.mark.parametrize("how", ["cancel", "deadline", "task group"])
async def test_execute_cancelled_by_its_callers_scope_cancels_its_lending_subtree(
    how: str,
) -> None:
    """A spawned parent holds one of two slots and delegates with execute(); the delegate
    waits on two grandchildren (lending the parent's slot, which one of them takes; an
    unrelated child holds the other slot). A scope of the *parent's* around the execute is
    cancelled: the delegate must end `cancelled` at once, its grandchildren cancelled,
    instead of waiting (shielded) for a slot that only its own grandchildren can free.
    Before: the parent hung until its watchdog."""
    scopes: list[anyio.CancelScope] = []
    delegated: list[DelegateResult] = []
    gate = anyio.Event()
    samples: list[int] = []

    async def unrelated(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "unrelated"

    async def grandchild(request: Request, ctx: RunContext) -> str:
        samples.append(ctx.manager.statistics().running)
        running_grandchild.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    running_grandchild = anyio.Event()

    async def delegate(request: Request, ctx: RunContext) -> str:
        first = ctx.spawn("grandchild")
        second = ctx.spawn("grandchild")  # queued behind the full limit
        await first.wait()
        await second.wait()
        return "delegate"

    async def parent(request: Request, ctx: RunContext) -> str:
        if how == "task group":

            async def run() -> None:
                delegated.append(await ctx.execute("delegate"))

            async with anyio.create_task_group() as tg:
                scopes.append(tg.cancel_scope)
                tg.start_soon(run)
        else:
            with anyio.CancelScope() as scope:
                scopes.append(scope)
                delegated.append(await ctx.execute("delegate"))
        samples.append(ctx.manager.statistics().running)
        return "parent went on"

    manager = make_manager(
        {"unrelated": unrelated, "grandchild": grandchild, "delegate": delegate, "parent": parent},
        limit=2,
        settle_timeout=30,
        spawn_timeout=30,
    )
    async with manager:
        with recorded(manager) as events:
            other = manager.spawn("unrelated")
            handle = manager.spawn("parent")
            with anyio.fail_after(5):
                await running_grandchild.wait()
            await anyio.wait_all_tasks_blocked()
            assert manager.statistics().spawned == 5
            assert manager.statistics().running == 2  # the unrelated child and a grandchild
            assert handle.state == "running"  # alive but holding neither slot: it lends its own
            (scope,) = scopes
            if how == "deadline":
                scope.deadline = anyio.current_time()
            else:
                scope.cancel()
            with anyio.fail_after(5):
                envelope = await handle.wait()
            assert envelope.status == "completed", envelope
            assert envelope.output == "parent went on"
            assert delegated == []  # the execute was cancelled, not returned
            (d,) = manager.tasks(handle.task_id)
            assert d.result is not None
            assert d.result.status == "cancelled"
            assert d.result.error == "cancelled: the caller was cancelled"
            grandchildren = manager.tasks(d.task_id)
            assert len(grandchildren) == 2
            for g in grandchildren:
                assert g.result is not None
                assert g.result.status == "cancelled"
            assert other.result is None  # an unrelated child is left alone
            gate.set()
            with anyio.fail_after(5):
                assert (await other.wait()).status == "completed"
        _check_accounting(manager, samples)
        _check_one_envelope_each(manager, events)


async def test_a_delegates_given_up_wait_runs_on_a_borrowed_slot() -> None:
    """The other side of the test above: a scope *inside* the delegate's runner (a wait it
    gives up on) cancels nothing. The grandchild holds the only slot, so the delegate goes
    on at once on a borrowed slot instead of waiting for it; the grandchild keeps running,
    the borrow shows in the statistics and is repaid when the grandchild's slot frees."""
    stop_waiting: list[anyio.CancelScope] = []
    waiting = anyio.Event()
    gave_up = anyio.Event()
    gate = anyio.Event()
    grandchild_done = anyio.Event()
    spawned: list[SpawnHandle] = []

    async def grandchild(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "grandchild"

    async def delegate(request: Request, ctx: RunContext) -> str:
        child = ctx.spawn("grandchild")
        spawned.append(child)
        with anyio.CancelScope() as scope:
            stop_waiting.append(scope)
            waiting.set()
            await child.wait()
        gave_up.set()
        assert child.result is None  # it holds the only slot and is still running
        await grandchild_done.wait()
        return f"gave up waiting; {child.result.status}"

    async def parent(request: Request, ctx: RunContext) -> str:
        return (await ctx.execute("delegate")).output

    manager = make_manager(
        {"grandchild": grandchild, "delegate": delegate, "parent": parent}, limit=1
    )
    async with manager:
        handle = manager.spawn("parent")
        with anyio.fail_after(5):
            await waiting.wait()
        await anyio.wait_all_tasks_blocked()
        assert manager.statistics().spawned == 3
        stop_waiting[0].cancel()
        with anyio.fail_after(5):
            await gave_up.wait()
        stats = manager.statistics()
        assert (stats.running, stats.borrowed, stats.borrows) == (2, 1, 1)
        assert stats.high_water == 1
        gate.set()
        with anyio.fail_after(5):
            await spawned[0].wait()
        stats = manager.statistics()
        assert (stats.running, stats.borrowed) == (1, 0)  # the borrow was repaid
        grandchild_done.set()
        with anyio.fail_after(5):
            envelope = await handle.wait()
        assert envelope.output == "gave up waiting; completed"
        assert manager.statistics().high_water == 1
        assert manager.statistics().running == 0


async def test_a_scope_between_two_nested_delegates_cancels_only_the_inner_ones_subtree() -> None:
    """parent -> execute(outer) -> [scope] -> execute(inner) -> grandchild. Cancelling the
    scope, which lies inside the outer delegate's runner, dooms the inner delegate (its
    grandchild holding the last slot is cancelled) but not the outer one: the outer
    delegate's own spawned child runs on and completes."""
    scopes: list[anyio.CancelScope] = []
    gate = anyio.Event()
    running_grandchild = anyio.Event()

    async def gated(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "gated"

    async def grandchild(request: Request, ctx: RunContext) -> str:
        running_grandchild.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def inner(request: Request, ctx: RunContext) -> str:
        await ctx.spawn("grandchild").wait()
        return "inner"

    async def outer(request: Request, ctx: RunContext) -> str:
        kept = ctx.spawn("gated")  # takes the free slot
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await ctx.execute("inner")
        assert kept.result is None  # not cancelled with the inner delegate's subtree
        gate.set()
        return (await kept.wait()).status

    async def parent(request: Request, ctx: RunContext) -> str:
        return (await ctx.execute("outer")).output

    manager = make_manager(
        {
            "gated": gated,
            "grandchild": grandchild,
            "inner": inner,
            "outer": outer,
            "parent": parent,
        },
        limit=2,
        settle_timeout=30,
        spawn_timeout=30,
        max_depth=4,
    )
    async with manager:
        handle = manager.spawn("parent")
        with anyio.fail_after(5):
            await running_grandchild.wait()
        await anyio.wait_all_tasks_blocked()
        assert manager.statistics().spawned == 5
        assert manager.statistics().running == 2  # the gated child and the grandchild
        assert handle.state == "running"  # alive but holding neither slot: it lends its own
        scopes[0].cancel()
        with anyio.fail_after(5):
            envelope = await handle.wait()
        assert envelope.output == "completed"
        statuses = {h.agent: h.result.status for h in records(manager) if h.result}
        assert statuses == {
            "gated": "completed",
            "grandchild": "cancelled",
            "inner": "cancelled",
            "outer": "completed",
            "parent": "completed",
        }
        assert manager.statistics().running == 0
        assert manager.statistics().high_water == 2


# ------------------------------------------------------------------ 3. aclose


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_aclose_is_bounded_with_cancellation_catchers_lenders_and_resumers(
    anyio_backend: object,
) -> None:
    """At aclose, runners that catch the cancellation and sleep on hold both slots, one
    parent lends its slot to such a child and another waits in the resumer queue. aclose
    still finishes near settle_timeout (cancellation is level-triggered: the sleep after
    the catch is cancelled too), every child ends in one envelope, no slot is left held."""
    entered = anyio.Event()
    both_entered = anyio.Event()
    catching: list[str] = []

    async def catcher(request: Request, ctx: RunContext) -> str:
        try:
            catching.append(ctx.task_id)
            entered.set()
            if len(catching) == 2:
                both_entered.set()
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            await anyio.sleep(30)  # ignores the cancellation... for one checkpoint
            raise
        raise AssertionError("unreachable")

    async def leaf(request: Request, ctx: RunContext) -> str:
        return "leaf"

    async def lender(request: Request, ctx: RunContext) -> str:
        await ctx.spawn("catcher").wait()
        return "lender"

    async def resumer(request: Request, ctx: RunContext) -> str:
        first = ctx.spawn("leaf")
        ctx.spawn("catcher")  # queued behind leaf: takes the slot the moment it frees
        await first.wait()
        return "resumer"

    manager = make_manager(
        {"catcher": catcher, "leaf": leaf, "lender": lender, "resumer": resumer},
        limit=2,
        settle_timeout=0.05,
    )
    with recorded(manager) as events, anyio.fail_after(5):
        async with manager:
            manager.spawn("lender")
            await entered.wait()
            manager.spawn("resumer")
            await both_entered.wait()  # the resumer's leaf has ended: its wait is over
            await anyio.wait_all_tasks_blocked()
            assert waiting_to_resume(manager) == 1
            assert manager.statistics().running == 2
            started = anyio.current_time()
        closing_took = anyio.current_time() - started  # aclose, on leaving the block
    if on_mock_clock(anyio_backend):
        assert closing_took < 1  # about settle_timeout, not the catchers' 30 s
    stats = manager.statistics()
    assert stats.running == 0
    assert stats.settled == stats.spawned == 5
    assert waiting_to_resume(manager) == 0
    _check_one_envelope_each(manager, events)
    statuses = {h.agent: h.result.status for h in records(manager) if h.result}
    assert statuses == {
        "catcher": "cancelled",
        "leaf": "completed",
        "lender": "cancelled",
        "resumer": "cancelled",
    }


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_aclose_waits_for_a_shielded_child_but_not_for_a_resumer_behind_it(
    anyio_backend: object,
) -> None:
    """A child shielding itself from cancellation cannot be cut off (structured concurrency:
    aclose waits for it, a documented limit), but a parent waiting in the resumer queue for
    the slot that child holds adds nothing: aclose returns as soon as the shield lifts."""
    release_shield = anyio.Event()
    entered = anyio.Event()

    async def shielded(request: Request, ctx: RunContext) -> str:
        entered.set()
        with anyio.CancelScope(shield=True):
            await release_shield.wait()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def leaf(request: Request, ctx: RunContext) -> str:
        return "leaf"

    async def resumer(request: Request, ctx: RunContext) -> str:
        first = ctx.spawn("leaf")
        ctx.spawn("shielded")  # takes the only slot once leaf frees it
        await first.wait()
        return "resumer"

    manager = make_manager(
        {"shielded": shielded, "leaf": leaf, "resumer": resumer}, limit=1, settle_timeout=0.05
    )
    closing = anyio.Event()
    lifted: list[float] = []
    closed: list[float] = []

    async def lift_the_shield_later() -> None:
        await closing.wait()
        await anyio.sleep(0.2)  # well past settle_timeout
        assert closed == []  # the shielded child still holds aclose
        lifted.append(anyio.current_time())
        release_shield.set()

    with recorded(manager) as events:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lift_the_shield_later)
            with anyio.fail_after(5):
                async with manager:
                    handle = manager.spawn("resumer")
                    await entered.wait()  # the resumer's leaf has ended: its wait is over
                    await anyio.wait_all_tasks_blocked()
                    assert waiting_to_resume(manager) == 1
                    closing.set()  # aclose starts as the block is left
                closed.append(anyio.current_time())
                # aclose (the entering task's) returned once the shield lifted
    assert len(lifted) == len(closed) == 1
    if on_mock_clock(anyio_backend):
        assert closed[0] - lifted[0] < 0.05  # the resumer behind it added no wait
    assert handle.result is not None
    assert handle.result.status == "cancelled"
    stats = manager.statistics()
    assert stats.running == 0
    assert stats.settled == stats.spawned == 3
    _check_one_envelope_each(manager, events)
