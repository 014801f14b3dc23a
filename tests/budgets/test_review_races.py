"""Review: races between a budget running out and a child ending.

design/budgets.md: a node whose outcome is decided keeps it, "The exception is a node's
own final Result: past its own budget, its envelope is the BudgetExceeded error". A
straggling grandchild's report while the node settles must not waive that exception."""

from __future__ import annotations

import anyio
import pytest

from subagents import (
    Budget,
    Request,
    Result,
    RunContext,
    Status,
    SubagentConfig,
    SubagentManager,
    Usage,
)
from tests.helpers import spec

pytestmark = pytest.mark.anyio


async def test_a_final_result_past_its_own_budget_is_budget_exceeded_after_a_settle_report() -> (
    None
):
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
    config = SubagentConfig(spawn_timeout=None, execute_timeout=None)
    async with SubagentManager(agents, config=config) as m:
        without = await m.execute("alone", budget=Budget(tokens=100))
        envelope = await m.execute("parent", budget=Budget(tokens=100))
    assert without.error_type == "BudgetExceeded"  # the rule, with no child
    assert envelope.tree_usage == Usage(input_tokens=160)
    assert (envelope.status, envelope.error_type) == (Status.ERROR, "BudgetExceeded")
