"""A manager's own tracer and meter providers: given, kept apart, resolved once, broken."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from subagents import (
    AgentSpec,
    Request,
    RunContext,
    SubagentConfig,
    SubagentManager,
)
from subagents._handle import record_of
from subagents._tool_tracing import tool_span
from subagents.tools import build_tools
from tests.tracing.support import (
    parent_id,
    span_id,
    spec,
)

# --------------------------------------------------------------------------- providers


def _own_provider() -> tuple[TracerProvider, InMemorySpanExporter]:

    own = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(own))
    return provider, own


class _Counting:
    """A tracer and meter provider that notes each time it is asked for a tracer or a
    meter (a tracer from ``provider``, a meter from an in-memory meter provider)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
        self.asked: list[str] = []

    def get_tracer(self, name: str, *args: object) -> trace.Tracer:
        self.asked.append("tracer")
        return self.provider.get_tracer(name)

    def get_meter(self, name: str, *args: object) -> object:
        self.asked.append("meter")
        return self.meters.get_meter(name)


@pytest.mark.anyio
async def test_a_given_tracer_provider_receives_the_spans(
    exporter: InMemorySpanExporter,
) -> None:
    async def with_tool(request: Request, ctx: RunContext) -> str:
        with tool_span("read_file"):
            pass
        return "ok"

    provider, own = _own_provider()
    config = SubagentConfig(tracer_provider=provider)
    async with SubagentManager([spec("general", with_tool)], config=config) as manager:
        await manager.spawn("general").wait()
        await manager.execute("general")
    names = sorted(s.name for s in own.get_finished_spans())
    assert names == ["execute_tool read_file"] * 2 + ["invoke_agent general"] * 2
    assert not [s for s in exporter.get_finished_spans() if "general" in s.name]


@pytest.mark.anyio
async def test_managers_with_their_own_providers_keep_their_spans_and_links_apart(
    exporter: InMemorySpanExporter,
) -> None:
    """The host's tool calls go to the provider of the manager the tools act on, with the
    children they spawn; each tool span links only to its own manager's children."""
    provider_a, own_a = _own_provider()
    provider_b, own_b = _own_provider()
    manager_a = SubagentManager([spec("a")], config=SubagentConfig(tracer_provider=provider_a))
    manager_b = SubagentManager([spec("b")], config=SubagentConfig(tracer_provider=provider_b))
    async with manager_a, manager_b:
        tools_a = build_tools(manager_a, "root")
        tools_b = build_tools(manager_b, "root")
        spawned_a = await tools_a.call("spawn_agent", {"agent": "a", "input": "x"})
        spawned_b = await tools_b.call("spawn_agent", {"agent": "b", "input": "x"})
        task_a, task_b = spawned_a.details["task_id"], spawned_b.details["task_id"]
        await tools_a.call("wait_agent", {"task_ids": [task_a], "timeout_ms": 5000})
        await tools_b.call("wait_agent", {"task_ids": [task_b], "timeout_ms": 5000})
    for own, agent in ((own_a, "a"), (own_b, "b")):
        by_name = {s.name: s for s in own.get_finished_spans()}
        assert sorted(by_name) == [
            "execute_tool spawn_agent",
            "execute_tool wait_agent",
            f"invoke_agent {agent}",
        ]
        child = by_name[f"invoke_agent {agent}"]
        assert parent_id(child) == span_id(by_name["execute_tool spawn_agent"])
        linked = [link.context.span_id for link in by_name["execute_tool wait_agent"].links]
        assert linked == [span_id(child)]
    assert not [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]


@pytest.mark.anyio
async def test_the_host_tool_calls_of_an_untraced_manager_make_no_spans(
    exporter: InMemorySpanExporter,
) -> None:
    config = SubagentConfig(tracing=False)
    async with SubagentManager([spec("general")], config=config) as manager:
        tools = build_tools(manager, "root")
        spawned = await tools.call("spawn_agent", {"agent": "general", "input": "x"})
        await tools.call("wait_agent", {"task_ids": [spawned.details["task_id"]]})
        await tools.call("no_such_tool", {})
    assert exporter.get_finished_spans() == ()


@pytest.mark.anyio
async def test_the_providers_are_resolved_once_when_the_manager_is_entered() -> None:
    """A provider handed in is asked for its tracer and meter once per manager, however
    many children run."""
    provider, own = _own_provider()
    counting = _Counting(provider)
    config = SubagentConfig(tracer_provider=counting, meter_provider=counting)
    manager = SubagentManager([spec("general")], config=config)
    assert counting.asked == []
    async with manager:
        for _ in range(3):
            await manager.spawn("general").wait()
    assert counting.asked == ["tracer", "meter"]
    assert len(own.get_finished_spans()) == 3
    counting.meters.shutdown()


def test_a_provider_must_have_its_getter() -> None:
    from subagents import ConfigError

    with pytest.raises(ConfigError, match="tracer_provider"):
        SubagentConfig(tracer_provider="global")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="meter_provider"):
        SubagentConfig(meter_provider=TracerProvider())  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_broken_provider_leaves_the_manager_untraced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def get_tracer(self, name: str, *args: object) -> trace.Tracer:
            raise RuntimeError("provider bug")

    config = SubagentConfig(tracer_provider=Broken())
    async with SubagentManager([spec("general")], config=config) as manager:
        handle = manager.spawn("general")
        assert (await handle.wait()).status == "completed"
        # private: no public view of a child's tracing state; untraced, none was made.
        assert record_of(handle).trace is None
    assert "provider bug" in caplog.text


@pytest.mark.anyio
async def test_tools_trace_with_the_managers_providers_resolved_once() -> None:
    provider, exported = _own_provider()
    counting = _Counting(provider)
    config = SubagentConfig(tracer_provider=counting, meter_provider=counting)
    spec = AgentSpec(name="general", description="d", runner=_echo)
    async with SubagentManager([spec], config=config) as manager:
        for session in ("a", "b", "c"):
            await build_tools(manager, session).call("list_agents", {})
    assert counting.asked == ["tracer", "meter"]
    assert [s.name for s in exported.get_finished_spans()].count("execute_tool list_agents") == 3


async def _echo(request: Request, ctx: RunContext) -> str:
    return request.input
