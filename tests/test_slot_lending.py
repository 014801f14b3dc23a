"""A parent blocked on its own children lends its slot: nested trees never deadlock."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from subagents import AgentSpec, RunContext, SubagentConfig, SubagentManager
from subagents._spec import Request

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
