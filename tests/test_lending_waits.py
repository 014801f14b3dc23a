"""Every blocking wait a child can reach lends its slot, and a timed wait returns on time.

A child that runs its own agent loop (``build_tools(ctx.manager, ctx.session_id)``) blocks
in ``wait_agent``; at a full limit its grandchildren need the slot it holds. A timed wait
that gives up while the limit is still full must not wait for a slot to come back: the
child runs on on a borrowed slot, visible in ``statistics()`` and repaid first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager
from subagents.tools import build_tools
from tests.helpers import clock_backends, on_mock_clock

pytestmark = pytest.mark.anyio


def _spec(name: str, runner: Callable[[Request, RunContext], Awaitable[str]]) -> AgentSpec:
    return AgentSpec(name=name, description=f"test agent {name}", runner=runner)


async def _leaf(request: Request, ctx: RunContext) -> str:
    return f"leaf {request.input}"


async def _tool_loop_parent(request: Request, ctx: RunContext) -> str:
    """What a model's loop inside a child does: spawn two children, then wait_agent."""
    tools = build_tools(ctx.manager, ctx.session_id)
    ids = []
    for part in ("a", "b"):
        spawned = await tools.call("spawn_agent", {"agent": "leaf", "input": part})
        assert not spawned.is_error, spawned.content
        ids.append(spawned.details["task_id"])
    waited = await tools.call("wait_agent", {"task_ids": ids, "timeout_ms": 20_000})
    assert not waited.is_error, waited.content
    results = waited.details["results"]
    assert isinstance(results, list)
    return ",".join(str(r["output"]) for r in results if isinstance(r, dict))


@pytest.mark.parametrize(("limit", "parents"), [(1, 1), (1, 3), (4, 4), (2, 5)])
async def test_a_childs_wait_agent_lends_its_slot(limit: int, parents: int) -> None:
    config = SubagentConfig(max_concurrent_spawns=limit)
    specs = [_spec("leaf", _leaf), _spec("loop", _tool_loop_parent)]
    async with SubagentManager(specs, config=config) as manager:
        handles = [manager.spawn("loop") for _ in range(parents)]
        with anyio.fail_after(10):
            envelopes = [await h.wait() for h in handles]
        for envelope in envelopes:
            assert envelope.status == "completed", envelope
            assert envelope.output == "leaf a,leaf b"
        stats = manager.statistics()
        assert stats.high_water <= limit
        assert stats.borrows == 0  # nothing timed out: every slot came back normally


async def test_a_childs_completions_wait_lends_its_slot() -> None:
    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("leaf", "x")
        ready = await ctx.manager.completions(ctx.session_id)
        return ready[0].output

    config = SubagentConfig(max_concurrent_spawns=1)
    async with SubagentManager([_spec("leaf", _leaf), _spec("p", parent)], config=config) as m:
        with anyio.fail_after(10):
            envelope = await m.spawn("p").wait()
        assert envelope.output == "leaf x"


# ---------------------------------------------------------------- timed waits at a full limit


WaitFn = Callable[[RunContext, str], Awaitable[object]]


async def _ctx_wait(ctx: RunContext, task_id: str) -> object:
    return await ctx.wait(task_id, timeout=0.05)


async def _handle_wait(ctx: RunContext, task_id: str) -> object:
    with anyio.move_on_after(0.05):
        return await ctx.manager.handle(task_id).wait()
    return None


async def _mailbox_wait(ctx: RunContext, task_id: str) -> object:
    return await ctx.mailbox.wait(task_id, timeout=0.05)


async def _tool_wait(ctx: RunContext, task_id: str) -> object:
    tools = build_tools(ctx.manager, ctx.session_id)
    answer = await tools.call("wait_agent", {"task_ids": [task_id], "timeout_ms": 50})
    assert answer.details["timed_out"] is True, answer.content
    return None


@pytest.mark.parametrize("anyio_backend", clock_backends())
@pytest.mark.parametrize("wait", [_ctx_wait, _handle_wait, _mailbox_wait, _tool_wait])
async def test_a_timed_wait_at_a_full_limit_returns_on_time(
    wait: WaitFn, anyio_backend: object
) -> None:
    """The grandchild holds the only slot until the test lets it go, which happens only
    after the parent's wait has returned: a wait that waited for the slot never returns."""
    release = anyio.Event()
    waited: list[float] = []
    after_wait = anyio.Event()

    async def grandchild(request: Request, ctx: RunContext) -> str:
        await release.wait()
        return "late"

    async def parent(request: Request, ctx: RunContext) -> str:
        child = ctx.spawn("grandchild")
        began = anyio.current_time()
        assert await wait(ctx, child.task_id) is None
        waited.append(anyio.current_time() - began)
        after_wait.set()
        await release.wait()
        return "parent"

    config = SubagentConfig(max_concurrent_spawns=1)
    specs = [_spec("grandchild", grandchild), _spec("parent", parent)]
    async with SubagentManager(specs, config=config) as manager:
        handle = manager.spawn("parent")
        with anyio.fail_after(5):
            await after_wait.wait()
        stats = manager.statistics()
        assert (stats.running, stats.borrowed, stats.borrows) == (2, 1, 1)
        assert stats.high_water == 1  # the limiter's promise: held slots never exceed it
        assert stats.running - stats.borrowed <= stats.limit
        release.set()
        with anyio.fail_after(5):
            envelope = await handle.wait()
        assert envelope.output == "parent"
        stats = manager.statistics()
        assert (stats.running, stats.borrowed, stats.high_water) == (0, 0, 1)
    if on_mock_clock(anyio_backend):
        assert waited[0] == pytest.approx(0.05)  # its own timeout, not a wait for the slot


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_borrowed_slot_is_repaid_before_the_queue_is_admitted() -> None:
    release_grandchild = anyio.Event()
    release_parent = anyio.Event()
    borrowed = anyio.Event()
    order: list[str] = []

    async def grandchild(request: Request, ctx: RunContext) -> str:
        await release_grandchild.wait()
        order.append("grandchild ends")
        return "g"

    async def queued(request: Request, ctx: RunContext) -> str:
        order.append("queued starts")
        return "q"

    async def parent(request: Request, ctx: RunContext) -> str:
        child = ctx.spawn("grandchild")
        assert await ctx.wait(child.task_id, timeout=0.01) is None
        borrowed.set()
        await release_parent.wait()
        order.append("parent ends")
        return "p"

    config = SubagentConfig(max_concurrent_spawns=1)
    specs = [_spec("grandchild", grandchild), _spec("parent", parent), _spec("q", queued)]
    async with SubagentManager(specs, config=config) as manager:
        parent_handle = manager.spawn("parent")
        with anyio.fail_after(5):
            await borrowed.wait()
        later = manager.spawn("q")
        release_grandchild.set()
        with anyio.fail_after(5):
            while manager.statistics().borrowed:
                await anyio.wait_all_tasks_blocked()
        # The grandchild's slot repaid the parent's borrow: the queued child still waits.
        assert later.state == "queued"
        assert manager.statistics().running == 1
        release_parent.set()
        with anyio.fail_after(5):
            await later.wait()
            await parent_handle.wait()
    assert order == ["grandchild ends", "parent ends", "queued starts"]


async def test_a_cancelled_lender_runs_its_cleanup_on_a_borrowed_slot() -> None:
    """A child cancelled while lending (its slot taken by a grandchild) does not wait for a
    slot to end: it reaches its envelope at once, and cancels its subtree as it ends."""
    entered = anyio.Event()

    async def grandchild(request: Request, ctx: RunContext) -> str:
        entered.set()
        await anyio.sleep_forever()
        return "never"

    async def parent(request: Request, ctx: RunContext) -> str:
        child = ctx.spawn("grandchild")
        await child.wait()
        return "never"

    config = SubagentConfig(max_concurrent_spawns=1)
    specs = [_spec("grandchild", grandchild), _spec("parent", parent)]
    async with SubagentManager(specs, config=config) as manager:
        handle = manager.spawn("parent")
        with anyio.fail_after(5):
            await entered.wait()
        handle.cancel()
        with anyio.fail_after(5):
            envelope = await handle.wait()
        assert envelope.status == "cancelled"
        grandchild = manager.tasks(handle.task_id)
        assert [g.result.status for g in grandchild if g.result] == ["cancelled"]
        assert manager.statistics().running == 0
        assert manager.statistics().borrowed == 0


# ---------------------------------------------------------------- several tasks of one child


async def test_sibling_lends_leave_the_child_holding_a_slot_once_all_are_out() -> None:
    """Task B of a child takes its slot back and waits for one; task A starts lending,
    then leaves first. The slot handed to B stays B's: once both are out the child holds
    a slot, so a queued child cannot start beside it at a limit of 1."""
    first, second, a_may_wait = anyio.Event(), anyio.Event(), anyio.Event()
    after_waits = anyio.Event()
    finish = anyio.Event()
    seen: list[tuple[int, int]] = []

    async def leaf(request: Request, ctx: RunContext) -> str:
        await (first if request.input == "1" else second).wait()
        return request.input

    async def late(request: Request, ctx: RunContext) -> str:
        return "late"

    async def parent(request: Request, ctx: RunContext) -> str:
        one, two = ctx.spawn("leaf", "1"), ctx.spawn("leaf", "2")

        async def task_b() -> None:
            await ctx.wait(one.task_id)

        async def task_a() -> None:
            await a_may_wait.wait()
            await ctx.wait(two.task_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(task_b)
            tg.start_soon(task_a)
        stats = ctx.manager.statistics()
        seen.append((stats.running, stats.borrowed))
        after_waits.set()
        await finish.wait()
        return "parent"

    config = SubagentConfig(max_concurrent_spawns=1)
    specs = [_spec("leaf", leaf), _spec("late", late), _spec("parent", parent)]
    async with SubagentManager(specs, config=config) as manager:
        handle = manager.spawn("parent")
        await anyio.wait_all_tasks_blocked()
        queued = manager.spawn("late")
        await anyio.wait_all_tasks_blocked()
        first.set()
        await anyio.wait_all_tasks_blocked()
        a_may_wait.set()
        await anyio.wait_all_tasks_blocked()
        second.set()
        with anyio.fail_after(5):
            await after_waits.wait()
        await anyio.wait_all_tasks_blocked()
        assert seen == [(1, 0)]  # the parent holds the one slot
        assert queued.state == "queued"  # so the queued child waits for it
        finish.set()
        with anyio.fail_after(5):
            assert (await handle.wait()).output == "parent"
            assert (await queued.wait()).output == "late"
        assert manager.statistics().running == 0


async def test_a_task_outliving_its_runner_inside_a_lend_takes_no_slot_back() -> None:
    """A runner starts a task elsewhere that waits (lending the runner's slot) and returns
    before that wait ends: the ended child gets no slot back, so none is lost for good."""
    gate = anyio.Event()
    waiting = anyio.Event()

    async def other(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "other"

    async def leaf(request: Request, ctx: RunContext) -> str:
        return "leaf"

    async with anyio.create_task_group() as host:

        async def runner(request: Request, ctx: RunContext) -> str:
            target = ctx.manager.spawn("other", session_id="side")

            async def background() -> None:
                waiting.set()
                await target.wait()

            host.start_soon(background)
            await waiting.wait()
            return "runner"

        config = SubagentConfig(max_concurrent_spawns=1)
        specs = [_spec("other", other), _spec("leaf", leaf), _spec("runner", runner)]
        async with SubagentManager(specs, config=config) as manager:
            with anyio.fail_after(5):
                assert (await manager.spawn("runner").wait()).output == "runner"
            gate.set()
            with anyio.fail_after(5):
                await manager.tasks("side")[0].wait()
                await anyio.wait_all_tasks_blocked()
                assert manager.statistics().running == 0
                assert (await manager.spawn("leaf").wait()).output == "leaf"
