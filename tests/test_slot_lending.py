"""A parent blocked on its own children lends its slot: nested trees never deadlock, and a
lending parent that is cancelled, times out, settles or sees the limit rise never hangs."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from subagents import (
    AgentSpec,
    ManagerStatistics,
    Request,
    RunContext,
    SubagentConfig,
    SubagentManager,
)
from tests.helpers import clock_backends, manager_with, spec

pytestmark = pytest.mark.anyio


class Gauge:
    """Counts runners holding a slot (between entry and first blocking wait)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1


def tree_spec(gauge: Gauge, fan_out: int, leaf_depth: int) -> AgentSpec:
    async def node(request: Request, ctx: RunContext) -> str:
        gauge.enter()
        await anyio.lowlevel.checkpoint()
        gauge.leave()
        if ctx.agent_path.depth >= leaf_depth:
            return "leaf"
        children = [ctx.spawn("node") for _ in range(fan_out)]
        results = [await child.wait() for child in children]
        gauge.enter()
        await anyio.lowlevel.checkpoint()
        gauge.leave()
        return ",".join(r.status for r in results)

    return AgentSpec(name="node", description="a tree node", runner=node)


@pytest.mark.parametrize("limit", [1, 2, 5])
async def test_nested_tree_completes_within_the_limit(limit: int) -> None:
    gauge = Gauge()
    config = SubagentConfig(max_concurrent_spawns=limit, spawn_timeout=30)
    async with SubagentManager([tree_spec(gauge, 3, 3)], config=config) as manager:
        with anyio.fail_after(20):
            envelope = await manager.spawn("node").wait()
        assert envelope.status == "completed", envelope
        stats = manager.statistics()
        assert stats.spawned == 1 + 3 + 9  # depths 1, 2 and 3 (leaves)
        assert stats.high_water <= limit
        assert gauge.peak <= limit
        assert stats.running == 0


async def test_wait_result_from_a_child_lends_the_slot() -> None:
    async def parent(request: Request, ctx: RunContext) -> str:
        child = ctx.spawn("child")
        envelope = await ctx.wait(child.task_id, timeout=10)
        assert envelope is not None
        return envelope.output

    async def child(request: Request, ctx: RunContext) -> str:
        return "from child"

    specs = [
        AgentSpec(name="parent", description="p", runner=parent),
        AgentSpec(name="child", description="c", runner=child),
    ]
    config = SubagentConfig(max_concurrent_spawns=1)
    async with SubagentManager(specs, config=config) as manager:
        with anyio.fail_after(10):
            envelope = await manager.spawn("parent").wait()
        assert envelope.output == "from child"
        assert manager.statistics().high_water == 1


async def test_lend_slot_outside_a_child_is_a_no_op() -> None:
    async with SubagentManager() as manager:
        async with manager.lend_slot():
            assert manager.statistics().running == 0
        assert manager.statistics().running == 0


async def test_a_child_waiting_on_its_mailbox_lends_its_slot() -> None:
    async def parent(request: Request, ctx: RunContext) -> str:
        child = ctx.spawn("child")
        envelope = await ctx.mailbox.wait(child.task_id, timeout=10)
        assert envelope is not None
        return envelope.output

    async def child(request: Request, ctx: RunContext) -> str:
        return "via the mailbox"

    specs = [
        AgentSpec(name="parent", description="p", runner=parent),
        AgentSpec(name="child", description="c", runner=child),
    ]
    async with SubagentManager(specs, config=SubagentConfig(max_concurrent_spawns=1)) as manager:
        with anyio.fail_after(10):
            envelope = await manager.spawn("parent").wait()
        assert envelope.output == "via the mailbox"
        assert manager.statistics().high_water == 1


# ---------------------------------------------------------------- a lending parent never hangs


async def test_raising_the_limit_wakes_a_parent_waiting_to_resume() -> None:
    """A parent whose wait ended but found no free slot resumes as soon as the limit rises
    (not only once the unrelated running child ends)."""
    gate = anyio.Event()
    slow_started = anyio.Event()
    resumed = anyio.Event()

    async def fast(request: Request, ctx: RunContext) -> str:
        return "fast"

    async def slow(request: Request, ctx: RunContext) -> str:
        slow_started.set()
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
        with anyio.fail_after(5):
            await slow_started.wait()  # `fast` has ended: the parent's wait is over
        await anyio.wait_all_tasks_blocked()  # the parent waits for a slot to resume
        assert not resumed.is_set()
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
    entered = anyio.Event()

    async def forever(request: Request, ctx: RunContext) -> str:
        entered.set()
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
        with anyio.fail_after(5):
            await entered.wait()  # at a limit of 1 the child runs on the parent's lent slot
        await anyio.wait_all_tasks_blocked()
        assert manager.statistics().running == 1
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
    entered = anyio.Event()

    async def forever(request: Request, ctx: RunContext) -> str:
        entered.set()
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
        with anyio.fail_after(5):
            await entered.wait()  # the bottom runs: both ancestors lend
        await anyio.wait_all_tasks_blocked()
        assert (manager.statistics().spawned, manager.statistics().running) == (3, 1)
        assert handle.cancel()
        with anyio.fail_after(2):
            envelope = await handle.wait()
        assert envelope.status == "cancelled"
        assert manager.statistics().running == 0
        assert manager.statistics().settled == 3


@pytest.mark.parametrize("anyio_backend", clock_backends())
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


@pytest.mark.parametrize("anyio_backend", clock_backends())
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


@pytest.mark.anyio
async def test_a_runners_own_manager_never_lends_the_outer_childs_slot() -> None:
    # A runner with a manager of its own: waits on the inner manager lend inner slots
    # only; the outer child's slot belongs to the outer limiter.
    seen: dict[str, object] = {}
    release = anyio.Event()

    async def inner_child(request: Request, ctx: RunContext) -> str:
        seen["inner_running"] = inner.statistics().running
        await release.wait()
        return "inner"

    inner = SubagentManager(
        [AgentSpec(name="inner", description="d", runner=inner_child)],
        config=SubagentConfig(max_concurrent_spawns=1),
    )

    async def outer_child(request: Request, ctx: RunContext) -> str:
        async with inner:
            handle = inner.spawn("inner")
            release.set()
            await handle.wait()
            seen["inner_stats"] = inner.statistics()
        return "outer"

    outer_spec = AgentSpec(name="outer", description="d", runner=outer_child)
    config = SubagentConfig(max_concurrent_spawns=1)
    async with SubagentManager([outer_spec], config=config) as outer:
        envelope = await outer.spawn("outer").wait()
        assert envelope.ok, envelope
        assert outer.statistics().running == 0
    assert seen["inner_running"] == 1
    stats = seen["inner_stats"]
    assert isinstance(stats, ManagerStatistics)
    assert (stats.running, stats.borrowed) == (0, 0)
