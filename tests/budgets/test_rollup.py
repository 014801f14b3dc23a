"""Usage summed per tree: the envelope's tree_usage, manager.usage(tree=True), the
invoke_agent span, the completed event, ``subagents events summary``'s per-tree totals,
and a store that journals each spawn's budget for a re-run."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from subagents import (
    Budget,
    DelegateResult,
    Event,
    Request,
    Result,
    RunContext,
    SubagentConfig,
    SubagentManager,
    Usage,
)
from subagents._event_summary import summarize_events
from subagents._events import COMPLETED
from subagents._handle import record_of
from subagents._json import loads
from subagents._manager import budgets_of
from tests.helpers import spec
from tests.store.support import sqlite

pytestmark = pytest.mark.anyio


async def leaf(request: Request, ctx: RunContext) -> Result:
    return Result(output="leaf", usage=Usage(input_tokens=10, output_tokens=1))


async def middle(request: Request, ctx: RunContext) -> str:
    ctx.report(usage=Usage(input_tokens=100, output_tokens=10))
    await ctx.execute("leaf")
    await ctx.spawn("leaf").wait()
    return "middle"


async def top(request: Request, ctx: RunContext) -> str:
    ctx.report(usage=Usage(input_tokens=1000, output_tokens=100))
    await ctx.spawn("middle").wait()
    await ctx.execute("leaf")
    return "top"


AGENTS = [spec("leaf", leaf), spec("middle", middle), spec("top", top)]
TREE = Usage(input_tokens=1000 + 100 + 10 * 3, output_tokens=100 + 10 + 3)


async def test_an_envelope_carries_its_own_and_its_trees_usage() -> None:
    async with SubagentManager(AGENTS) as m:
        handle = m.spawn("top")
        envelope = await handle.wait()
        assert m.usage(handle.task_id) == Usage(input_tokens=1000, output_tokens=100)
        assert m.usage(handle.task_id, tree=True) == TREE
        lone = await m.execute("leaf")
        assert m.usage(lone.task_id, tree=True) == lone.usage
    assert envelope.usage == Usage(input_tokens=1000, output_tokens=100)
    assert envelope.tree_usage == TREE
    assert envelope.to_dict()["tree_usage"] == TREE.to_dict()
    assert DelegateResult.from_dict(envelope.to_dict()) == envelope
    assert "tree_usage" not in lone.to_dict()  # the same as usage: left out
    assert DelegateResult.from_dict(lone.to_dict()).tree_usage == lone.usage
    assert "with its subagents in 1130 / out 113" in envelope.truncated()


async def test_the_completed_event_and_the_summary_total_each_tree() -> None:
    events: list[Event] = []
    async with SubagentManager(AGENTS) as m:
        m.events.subscribe(events.append)
        first = await m.spawn("top").wait()
        second = await m.spawn("middle", session_id="other").wait()
    completed = {e.task_id: e.data for e in events if e.type == COMPLETED}
    assert completed[first.task_id]["tree_usage"] == TREE.to_dict()
    summary = summarize_events(events)
    trees = {t.task_id: t for t in summary.trees}
    assert set(trees) == {first.task_id, second.task_id}
    assert (trees[first.task_id].input_tokens, trees[first.task_id].output_tokens) == (1130, 113)
    assert trees[first.task_id].agents == 5
    assert (trees[second.task_id].agents, trees[second.task_id].session_id) == (3, "other")
    assert [t.task_id for t in summary.trees] == [first.task_id, second.task_id]
    assert "trees (2, the most tokens first):" in summary.format()
    assert summary.to_dict()["trees"][0]["input_tokens"] == 1130  # type: ignore[index]


async def test_the_invoke_agent_span_carries_both_usages() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = SubagentConfig(tracer_provider=provider)
    async with SubagentManager(AGENTS, config=config) as m:
        await m.spawn("top").wait()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent top"]
    assert span.attributes is not None
    assert span.attributes["gen_ai.usage.input_tokens"] == 1000
    assert span.attributes["subagents.tree_usage.input_tokens"] == 1130
    assert span.attributes["subagents.tree_usage.output_tokens"] == 113


async def test_with_a_store_the_budget_is_journaled_and_the_envelope_survives(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        handle = m.spawn("top", budget=Budget(tokens=5000, spawns=9))
        envelope = await handle.wait()
        task_id = handle.task_id
    with sqlite(path) as conn:
        (row,) = conn.execute("SELECT request FROM tasks WHERE task_id = ?", (task_id,))
    assert loads(row[0])["budget"] == {"tokens": 5000, "spawns": 9}
    async with SubagentManager(AGENTS, config=config) as again:
        assert again.result(task_id) == envelope
        assert again.usage(task_id, tree=True) == TREE


async def test_a_rerun_gets_the_budget_its_request_journaled() -> None:
    async def idle(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with SubagentManager([spec("idle", idle)]) as m:
        record = record_of(m.spawn("idle"))
        ledger = budgets_of(m)  # private: a re-run needs a crashed process to happen
        ledger.rerun(record, {"budget": {"tokens": 7}})
        assert record.account is not None
        assert record.account.limit == Budget(tokens=7)
        other = record_of(m.spawn("idle"))
        ledger.rerun(other, {"budget": {"tokens": -1}})  # damaged: no budget
        ledger.rerun(other, {})
        assert other.account is None
