"""Token and spawn budgets enforced as usage arrives: the over-budget child ends
``BudgetExceeded`` naming its budget and the overshoot, with its partial output, its
children cancelled; a spawn past an exhausted budget is refused naming it; a child's
budget never exceeds what its ancestors have left."""

from __future__ import annotations

import anyio
import pytest

from subagents import (
    AgentSpec,
    Budget,
    ConfigError,
    Request,
    Result,
    RetryPolicy,
    RunContext,
    SpawnOptions,
    SpawnRejected,
    Status,
    SubagentConfig,
    SubagentManager,
    TransientError,
    Usage,
)
from tests.helpers import spec

pytestmark = pytest.mark.anyio


async def reports_then_waits(request: Request, ctx: RunContext) -> str:
    """Reports its input's number of input tokens in steps of 100, then waits forever."""
    total = int(request.input)
    for used in range(100, total + 1, 100):
        ctx.report(append=f"{used} ", usage=Usage(input_tokens=used))
        await anyio.lowlevel.checkpoint()
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def idle(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def manager(*agents: AgentSpec, **config: object) -> SubagentManager:
    return SubagentManager(
        [spec("spend", reports_then_waits), spec("idle", idle), *agents],
        config=SubagentConfig(spawn_timeout=None, execute_timeout=None, **config),  # type: ignore[arg-type]
    )


async def test_a_child_past_its_token_budget_ends_budget_exceeded_with_its_output() -> None:
    async with manager() as m:
        handle = m.spawn("spend", "1000", budget=Budget(tokens=250))
        envelope = await handle.wait()
    assert envelope.status is Status.ERROR
    assert envelope.error_type == "BudgetExceeded"
    assert "budget of 250 tokens" in envelope.error
    assert "exceeded by 50" in envelope.error  # the third report, 300, crossed it
    assert envelope.output == "100 200 300 "  # partial output kept
    assert envelope.usage == Usage(input_tokens=300)


async def test_input_and_output_budgets_are_each_their_own() -> None:
    async def outputs(request: Request, ctx: RunContext) -> str:
        ctx.report(usage=Usage(input_tokens=10, output_tokens=500))
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with manager(spec("out", outputs)) as m:
        fine = m.spawn("out", budget=Budget(input_tokens=100, output_tokens=1000))
        over = m.spawn("out", budget=Budget(input_tokens=1000, output_tokens=100))
        envelope = await over.wait()
        assert "budget of 100 output tokens" in envelope.error
        assert fine.result is None  # within both: still running
        fine.cancel()


async def test_the_over_budget_ancestor_stops_and_its_subtree_is_cancelled() -> None:
    children: list[object] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        children.append(ctx.spawn("idle"))
        children.append(ctx.spawn("spend", "600"))
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with manager(spec("parent", parent)) as m:
        handle = m.spawn("parent", budget=Budget(tokens=450))
        envelope = await handle.wait()
        assert envelope.error_type == "BudgetExceeded"
        assert "of /root/parent exceeded by 50" in envelope.error
        ends = [m.result(c.task_id) for c in children]  # type: ignore[attr-defined]
    assert [e.status for e in ends if e is not None] == [Status.CANCELLED, Status.CANCELLED]
    assert all("ran out of budget" in e.error for e in ends if e is not None)
    assert envelope.tree_usage == Usage(input_tokens=500)


async def test_a_result_past_its_own_budget_is_an_error_that_keeps_the_output() -> None:
    async def costly(request: Request, ctx: RunContext) -> Result:
        return Result(output="done", usage=Usage(input_tokens=90, output_tokens=20))

    async with manager(spec("costly", costly)) as m:
        over = await m.execute("costly", budget=Budget(tokens=100))
        within = await m.execute("costly", budget=Budget(tokens=110))
    assert (over.status, over.error_type, over.output) == (Status.ERROR, "BudgetExceeded", "done")
    assert "exceeded by 10" in over.error
    assert within.ok


async def test_a_spawn_past_the_spawns_budget_is_refused_naming_it() -> None:
    refused: list[SpawnRejected] = []

    async def fan(request: Request, ctx: RunContext) -> str:
        for _ in range(3):
            try:
                ctx.spawn("idle")
            except SpawnRejected as exc:
                refused.append(exc)
        return "ok"

    async with manager(spec("fan", fan)) as m:
        assert (await m.execute("fan", budget=Budget(spawns=2))).ok
    assert [e.reason for e in refused] == ["budget_exhausted"]
    assert "budget of 2 spawns of /root/fan exhausted" in str(refused[0])


async def test_a_spawn_once_the_tokens_are_used_up_is_refused() -> None:
    caught: list[SpawnRejected] = []

    async def spends_then_spawns(request: Request, ctx: RunContext) -> str:
        ctx.report(usage=Usage(input_tokens=100))
        try:
            ctx.spawn("idle")
        except SpawnRejected as exc:
            caught.append(exc)
        return "ok"

    async with manager(spec("s", spends_then_spawns)) as m:
        await m.execute("s", budget=Budget(tokens=100))  # used up, not exceeded
    assert caught
    assert caught[0].reason == "budget_exhausted"
    assert "budget of 100 tokens" in str(caught[0])


async def test_a_childs_budget_is_carved_from_what_its_parent_has_left() -> None:
    seen: dict[str, Budget] = {}

    async def child(request: Request, ctx: RunContext) -> str:
        seen[request.input] = ctx.remaining_budget()
        return "ok"

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.report(usage=Usage(input_tokens=700))
        seen["parent"] = ctx.remaining_budget()
        await ctx.execute("child", "asks more", budget=Budget(tokens=5000, spawns=10))
        await ctx.execute("child", "asks less", options=SpawnOptions(budget=Budget(tokens=10)))
        await ctx.execute("child", "asks nothing")
        return "ok"

    agent = spec("child", child, budget=Budget(output_tokens=40))
    async with manager(spec("parent", parent), agent) as m:
        await m.execute("parent", budget=Budget(tokens=1000, spawns=5))
    assert seen["parent"] == Budget(tokens=300, spawns=5)
    assert seen["asks more"] == Budget(tokens=300, output_tokens=40, spawns=4)
    assert seen["asks less"] == Budget(tokens=10, output_tokens=40, spawns=3)
    assert seen["asks nothing"] == Budget(tokens=300, output_tokens=40, spawns=2)


async def test_without_any_budget_nothing_is_limited() -> None:
    seen: list[Budget] = []

    async def look(request: Request, ctx: RunContext) -> str:
        seen.append(ctx.remaining_budget())
        return "ok"

    async with manager(spec("look", look)) as m:
        await m.execute("look")
    assert seen == [Budget()]


async def test_a_session_budget_is_shared_by_every_tree_of_the_session() -> None:
    async with manager() as m:
        m.open_session("conv", budget=Budget(tokens=1000, spawns=3))
        first = m.spawn("spend", "400", session_id="conv")
        second = m.spawn("spend", "700", session_id="conv")
        ends = [await first.wait(), await second.wait()]
        assert {e.error_type for e in ends} == {"BudgetExceeded"}
        assert all("of session 'conv'" in e.error for e in ends)
        with pytest.raises(SpawnRejected) as caught:
            m.spawn("idle", session_id="conv")
        assert caught.value.reason == "budget_exhausted"
        m.spawn("spend", "100").cancel()  # another session: not limited


async def test_a_lowered_report_lets_a_budget_stop_its_next_overrun() -> None:
    async def refunded(request: Request, ctx: RunContext) -> str:
        ctx.report(usage=Usage(input_tokens=150))
        try:
            await anyio.sleep_forever()
        finally:
            ctx.report(usage=Usage())  # its last figure: nothing was billed after all
        raise AssertionError("unreachable")

    async def spends(request: Request, ctx: RunContext) -> str:
        ctx.report(usage=Usage(input_tokens=150))
        await anyio.lowlevel.checkpoint()
        return "done"

    async with manager(spec("refunded", refunded), spec("spends", spends)) as m:
        m.open_session("conv", budget=Budget(tokens=100))
        first = await m.spawn("refunded", session_id="conv").wait()
        assert m.usage(first.task_id) == Usage()  # within the budget again: spawns go on
        second = await m.spawn("spends", session_id="conv").wait()
    assert first.error_type == "BudgetExceeded"
    assert (second.status, second.error_type) == (Status.ERROR, "BudgetExceeded")
    assert "(150 used)" in second.error


async def test_what_a_failed_try_spent_stays_charged_to_its_budget() -> None:
    async def reports(request: Request, ctx: RunContext) -> str:
        ctx.report(usage=Usage(input_tokens=80))  # each try reports its own total
        if ctx.attempt == 1:
            raise TransientError("try again")
        await anyio.lowlevel.checkpoint()
        return "done"

    async def returns(request: Request, ctx: RunContext) -> Result:
        if ctx.attempt == 1:
            ctx.report(usage=Usage(input_tokens=80))
            raise TransientError("try again")
        return Result(output="done", usage=Usage(input_tokens=30))

    retry = RetryPolicy(attempts=2, initial=0, jitter=0)
    agents = [spec("reports", reports, retry=retry), spec("returns", returns, retry=retry)]
    async with manager(*agents) as m:
        reported = await m.execute("reports", budget=Budget(tokens=100))
        returned = await m.execute("returns", budget=Budget(tokens=100))
    assert (reported.status, reported.error_type) == (Status.ERROR, "BudgetExceeded")
    assert "(160 used)" in reported.error  # not 80: the second try refunds nothing
    assert reported.tree_usage == Usage(input_tokens=160)
    assert (returned.status, returned.error_type) == (Status.ERROR, "BudgetExceeded")
    assert returned.output == "done"
    assert (returned.usage, returned.tree_usage) == (
        Usage(input_tokens=30),
        Usage(input_tokens=110),
    )


async def test_open_session_refuses_what_it_cannot_honour() -> None:
    async with manager() as m:
        m.open_session("a", budget=Budget(tokens=1))
        with pytest.raises(ConfigError, match="no budget"):
            m.open_session("a", budget=Budget(tokens=1))
        m.spawn("idle", session_id="b")
        with pytest.raises(ConfigError, match="no unfinished children"):
            m.open_session("b", budget=Budget(tokens=1))
        with pytest.raises(ConfigError, match="a Budget"):
            m.open_session("c", budget={"tokens": 1})  # type: ignore[arg-type]
        child = m.spawn("idle")
        with pytest.raises(ConfigError, match="root session"):
            m.open_session(child.task_id, budget=Budget(tokens=1))
        await m.close_session("d")
        with pytest.raises(SpawnRejected):
            m.open_session("d", budget=Budget(tokens=1))


def test_open_session_outside_a_running_manager_is_refused_clearly() -> None:
    with pytest.raises(SpawnRejected) as caught:
        manager().open_session("conv", budget=Budget(seconds=5))
    assert caught.value.reason == "manager_closed"
    assert "not running" in str(caught.value)


async def test_a_final_result_past_its_own_budget_is_budget_exceeded_after_a_settle_report() -> (
    None
):
    """design/budgets.md: a node whose outcome is decided keeps it, "The exception is a
    node's own final Result: past its own budget, its envelope is the BudgetExceeded
    error". A straggling grandchild's report while the node settles must not waive that
    exception."""
    running = anyio.Event()

    async def reports_as_it_is_cancelled(request: Request, ctx: RunContext) -> str:
        running.set()
        try:
            await anyio.sleep_forever()
        finally:
            ctx.report(usage=Usage(input_tokens=10))  # what its last call cost
        raise AssertionError("unreachable")

    async def parent(request: Request, ctx: RunContext) -> Result:
        ctx.report(usage=Usage(input_tokens=95))
        ctx.spawn("straggler")
        await running.wait()  # it runs (a queued child ends without reporting)
        return Result(output="done", usage=Usage(input_tokens=150))  # alone past 100

    async def alone(request: Request, ctx: RunContext) -> Result:
        ctx.report(usage=Usage(input_tokens=95))
        return Result(output="done", usage=Usage(input_tokens=150))

    agents = [
        spec("parent", parent),
        spec("alone", alone),
        spec("straggler", reports_as_it_is_cancelled),
    ]
    async with manager(*agents) as m:
        without = await m.execute("alone", budget=Budget(tokens=100))
        envelope = await m.execute("parent", budget=Budget(tokens=100))
    assert without.error_type == "BudgetExceeded"  # the rule, with no child
    assert envelope.tree_usage == Usage(input_tokens=160)
    assert (envelope.status, envelope.error_type) == (Status.ERROR, "BudgetExceeded")
