"""A runaway tree, each agent reporting tokens then spawning two more, is stopped by its
budget within one report, and every spawn still ends in exactly one envelope."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from subagents import (
    Budget,
    Event,
    Request,
    RunContext,
    SpawnRejected,
    Status,
    SubagentConfig,
    SubagentManager,
    Usage,
)
from subagents._events import COMPLETED, SPAWNED
from tests.helpers import spec

pytestmark = pytest.mark.anyio

REPORT = 100
"""Tokens each agent of the runaway tree reports before it spawns its two children."""


async def runaway(request: Request, ctx: RunContext) -> str:
    ctx.report(usage=Usage(input_tokens=REPORT // 2, output_tokens=REPORT // 2))
    handles = []
    for _ in range(2):
        try:
            handles.append(ctx.spawn("runaway"))
        except SpawnRejected:
            break  # the budget is used up: this agent does the rest itself
    for handle in handles:
        await handle.wait()
    return "done"


@pytest.mark.parametrize("limit", [1, 4, 64])
@pytest.mark.parametrize("budget", [1_000, 2_550, 5_000])
async def test_a_runaway_tree_stops_within_one_report_of_its_budget(
    budget: int, limit: int
) -> None:
    spawned: Counter[str] = Counter()
    completed: Counter[str] = Counter()

    def count(event: Event) -> None:
        if event.type == SPAWNED:
            spawned[event.task_id] += 1
        elif event.type == COMPLETED:
            completed[event.task_id] += 1

    config = SubagentConfig(max_depth=40, max_concurrent_spawns=limit, spawn_timeout=None)
    async with SubagentManager([spec("runaway", runaway)], config=config) as m:
        m.events.subscribe(count)
        with anyio.fail_after(30):
            top = await m.spawn("runaway", budget=Budget(tokens=budget)).wait()
        spent = m.usage(top.task_id, tree=True).total_tokens
        statuses = Counter(
            m.result(task_id).status  # type: ignore[union-attr]
            for task_id in spawned
        )
    assert budget < spent <= budget + REPORT  # stopped by the report that crossed it
    assert top.status is Status.ERROR
    assert top.error_type == "BudgetExceeded"
    assert top.tree_usage.total_tokens == spent
    assert set(spawned) == set(completed)  # every spawn ended...
    assert set(completed.values()) == {1}  # ...in exactly one envelope
    assert statuses[Status.CANCELLED] + statuses[Status.COMPLETED] == len(spawned) - 1
