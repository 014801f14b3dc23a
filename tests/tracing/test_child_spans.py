"""The spans of children: spawn, delegate, failures, and the metrics they count."""

from __future__ import annotations

import anyio
import pytest
from opentelemetry import baggage, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from subagents import (
    Request,
    Result,
    RunContext,
    SpawnOptions,
    SubagentConfig,
    SubagentManager,
    Usage,
)
from subagents._handle import record_of
from subagents._manager import telemetry_of
from tests.helpers import clock_backends
from tests.tracing.support import (
    broken,
    event_names,
    no_gen_ai_system,
    one,
    parent_id,
    span_id,
    spans_named,
    spec,
    tracer,
)

# --------------------------------------------------------------------------- spawn


@pytest.mark.anyio
async def test_spawn_span_is_child_of_spawn_time_span(exporter: InMemorySpanExporter) -> None:
    # The worker that runs B was started while span "x" was current (by A's spawn); B was
    # spawned under "y". B's span must hang under "y", not under whatever the worker inherited.
    release = anyio.Event()

    async def blocker(request: Request, ctx: RunContext) -> str:
        await release.wait()
        return "a"

    agents = [spec("blocker", blocker), spec("general", model="m-1", provider="acme")]
    async with SubagentManager(agents, config=SubagentConfig(max_concurrent_spawns=1)) as manager:
        with tracer().start_as_current_span("x"):
            a = manager.spawn("blocker", "first")
        with tracer().start_as_current_span("y"):
            b = manager.spawn("general", "second")
        assert b.queue_position == 1
        await anyio.wait_all_tasks_blocked()
        release.set()
        await b.wait()
        await a.wait()

    x, y = one(exporter, "x"), one(exporter, "y")
    span_a = one(exporter, "invoke_agent blocker")
    span_b = one(exporter, "invoke_agent general")
    assert parent_id(span_a) == span_id(x)
    assert parent_id(span_b) == span_id(y)
    assert span_b.context is not None
    assert y.context is not None
    assert span_b.context.trace_id == y.context.trace_id
    assert span_b.kind is SpanKind.INTERNAL
    attrs = dict(span_b.attributes or {})
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == "general"
    assert attrs["gen_ai.agent.id"] == b.task_id
    assert attrs["gen_ai.agent.description"] == "general agent"
    # The default session's trees carry the run's own conversation id.
    assert attrs["gen_ai.conversation.id"] == telemetry_of(manager).conversation_id
    assert attrs["gen_ai.request.model"] == "m-1"
    assert attrs["gen_ai.provider.name"] == "acme"
    assert attrs["gen_ai.usage.input_tokens"] == 3
    assert attrs["gen_ai.usage.output_tokens"] == 5
    assert attrs["subagents.task_id"] == b.task_id
    assert attrs["subagents.agent_path"] == "/root/general"
    assert attrs["subagents.parent_path"] == "/root"
    assert attrs["subagents.status"] == "completed"
    assert attrs["subagents.mode"] == "spawn"
    assert isinstance(attrs["subagents.queue_ms"], int)
    assert "error.type" not in attrs
    assert span_b.status.status_code is StatusCode.UNSET
    assert event_names(span_b) == ["queued", "started"]
    assert span_b.events[0].attributes == {"subagents.queue_position": 1}
    no_gen_ai_system(exporter.get_finished_spans())


@pytest.mark.anyio
async def test_invoke_agent_span_records_iterations_and_no_content_by_default(
    exporter: InMemorySpanExporter,
) -> None:
    async def reporting(request: Request, ctx: RunContext) -> Result:
        ctx.report(iterations=1)
        return Result(output=f"echo {request.input}", usage=Usage(input_tokens=11, output_tokens=7))

    agents = [spec("echo", reporting, model="gpt-test", provider="openai")]
    async with SubagentManager(agents) as m:
        env = await m.spawn("echo", "hello").wait()
    span = one(exporter, "invoke_agent echo")
    assert span.kind == SpanKind.INTERNAL
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == "echo"
    assert attrs["gen_ai.agent.id"] == env.task_id
    assert attrs["gen_ai.agent.description"] == "echo agent"
    assert attrs["gen_ai.conversation.id"] == telemetry_of(m).conversation_id
    assert attrs["gen_ai.request.model"] == "gpt-test"
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.usage.input_tokens"] == 11
    assert attrs["gen_ai.usage.output_tokens"] == 7
    assert attrs["subagents.task_id"] == env.task_id
    assert attrs["subagents.agent_path"] == "/root/echo"
    assert attrs["subagents.parent_path"] == "/root"
    assert attrs["subagents.status"] == "completed"
    assert attrs["subagents.iterations"] == 1
    assert "subagents.queue_ms" in attrs
    assert "error.type" not in attrs
    assert "gen_ai.system" not in attrs
    assert span.status.status_code != StatusCode.ERROR
    events = [e.name for e in span.events]
    assert "queued" in events
    assert "started" in events
    # no content unless asked for
    for value in attrs.values():
        assert "hello" not in str(value)


@pytest.mark.anyio
async def test_no_model_and_the_default_provider_when_the_spec_has_none(
    exporter: InMemorySpanExporter,
) -> None:
    async with SubagentManager([spec("boom", broken)]) as m:
        await m.spawn("boom", "x").wait()
    attrs = dict(one(exporter, "invoke_agent boom").attributes or {})
    assert "gen_ai.request.model" not in attrs
    # gen_ai.provider.name is Required on invoke_agent: the documented default stands in.
    assert attrs["gen_ai.provider.name"] == "subagents"


@pytest.mark.anyio
async def test_spawn_outside_any_span_is_a_root(exporter: InMemorySpanExporter) -> None:
    async with SubagentManager([spec("echo")]) as m:
        with tracer().start_as_current_span("manager's own"):
            pass
        await m.spawn("echo", "x").wait()
    assert one(exporter, "invoke_agent echo").parent is None


@pytest.mark.anyio
async def test_usage_is_never_double_counted(exporter: InMemorySpanExporter) -> None:
    async def parent(request: Request, ctx: RunContext) -> Result:
        await ctx.spawn("echo", "x").wait()
        return Result(output="p", usage=Usage(input_tokens=100, output_tokens=1))

    async with SubagentManager([spec("echo"), spec("parent", parent)]) as m:
        env = await m.spawn("parent", "x").wait()
    assert env.usage == Usage(input_tokens=100, output_tokens=1)
    attrs = dict(one(exporter, "invoke_agent parent").attributes or {})
    assert attrs["gen_ai.usage.input_tokens"] == 100
    assert attrs["gen_ai.usage.output_tokens"] == 1


@pytest.mark.anyio
async def test_nested_spawn_three_levels(exporter: InMemorySpanExporter) -> None:
    seen: dict[str, object] = {}

    async def level(request: Request, ctx: RunContext) -> Result:
        depth = int(request.input)
        if depth < 3:
            child = ctx.spawn(f"l{depth + 1}", str(depth + 1))
            await child.wait()
        else:
            seen["baggage"] = dict(baggage.get_all())
            seen["span"] = trace.get_current_span().get_span_context().span_id
            seen["task"] = ctx.task_id
            seen["path"] = str(ctx.agent_path)
        # Child usage never leaks into the parent's span.
        return Result(output="ok", usage=Usage(input_tokens=depth, output_tokens=10 * depth))

    agents = [spec("l1", level), spec("l2", level), spec("l3", level)]
    async with SubagentManager(agents) as manager:
        with tracer().start_as_current_span("caller"):
            handle = manager.spawn("l1", "1", session_id="conv-7")
        await handle.wait()

    caller = one(exporter, "caller")
    l1, l2, l3 = (one(exporter, f"invoke_agent l{i}") for i in (1, 2, 3))
    assert parent_id(l1) == span_id(caller)
    assert parent_id(l2) == span_id(l1)
    assert parent_id(l3) == span_id(l2)
    assert {s.context.trace_id for s in (caller, l1, l2, l3) if s.context} == {
        caller.context.trace_id if caller.context else 0
    }
    for i, s in enumerate((l1, l2, l3), start=1):
        attrs = dict(s.attributes or {})
        assert attrs["gen_ai.conversation.id"] == "conv-7"
        assert attrs["gen_ai.usage.input_tokens"] == i
        assert attrs["gen_ai.usage.output_tokens"] == 10 * i
    assert dict(l3.attributes or {})["subagents.agent_path"] == "/root/l1/l2/l3"
    assert seen["span"] == span_id(l3)
    assert seen["baggage"] == {
        "gen_ai.conversation.id": "conv-7",
        "subagents.agent_path": seen["path"],
        "subagents.task_id": seen["task"],
    }


# --------------------------------------------------------------------------- delegate


@pytest.mark.anyio
async def test_an_execute_span_hangs_under_the_callers_span(exporter: InMemorySpanExporter) -> None:
    async with SubagentManager([spec("general")]) as manager:
        with tracer().start_as_current_span("turn"):
            envelope = await manager.execute("general", "hi", options=SpawnOptions(model="m-2"))
    turn = one(exporter, "turn")
    span = one(exporter, "invoke_agent general")
    assert parent_id(span) == span_id(turn)
    attrs = dict(span.attributes or {})
    assert attrs["subagents.mode"] == "execute"
    assert attrs["gen_ai.agent.id"] == envelope.task_id
    assert attrs["gen_ai.request.model"] == "m-2"
    assert attrs["gen_ai.provider.name"] == "subagents"  # Required: a default when unknown
    assert event_names(span) == ["started"]
    # Content is not captured by default.
    assert not any(k.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.system")) for k in attrs)


@pytest.mark.anyio
async def test_capture_content_records_input_output_and_instructions(
    exporter: InMemorySpanExporter,
) -> None:
    config = SubagentConfig(capture_content=True)
    async with SubagentManager([spec("general", prompt="be brief")], config=config) as manager:
        await manager.execute("general", "secret prompt")
    attrs = dict(one(exporter, "invoke_agent general").attributes or {})
    assert "secret prompt" in str(attrs["gen_ai.input.messages"])
    assert "echo secret prompt" in str(attrs["gen_ai.output.messages"])
    assert "be brief" in str(attrs["gen_ai.system_instructions"])
    assert "gen_ai.system" not in attrs


@pytest.mark.anyio
async def test_tracing_disabled_by_config(exporter: InMemorySpanExporter) -> None:
    async with SubagentManager([spec("general")], config=SubagentConfig(tracing=False)) as manager:
        handle = manager.spawn("general")
        await handle.wait()
        # private: no public view of a child's tracing state; none is made when off.
        assert record_of(handle).trace is None
    assert spans_named(exporter, "invoke_agent general") == []


# --------------------------------------------------------------------------- failures


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_timeout_span_is_marked_error_with_the_watchdog_event(
    exporter: InMemorySpanExporter,
) -> None:
    async def stuck(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        raise AssertionError

    async with SubagentManager([spec("stuck", stuck)]) as manager:
        envelope = await manager.spawn("stuck", timeout=0.02).wait()
    assert envelope.status == "timeout"
    span = one(exporter, "invoke_agent stuck")
    attrs = dict(span.attributes or {})
    assert attrs["error.type"] == "timeout"
    assert attrs["subagents.status"] == "timeout"
    assert span.status.status_code is StatusCode.ERROR
    assert event_names(span) == ["queued", "started", "watchdog.fired"]


@pytest.mark.anyio
async def test_an_error_span_names_the_exception_and_is_marked_error(
    exporter: InMemorySpanExporter,
) -> None:
    async def broken(request: Request, ctx: RunContext) -> str:
        raise ValueError("bad input")

    async with SubagentManager([spec("broken", broken)]) as manager:
        envelope = await manager.execute("broken")
    assert envelope.status == "error"
    span = one(exporter, "invoke_agent broken")
    attrs = dict(span.attributes or {})
    assert attrs["error.type"] == "ValueError"
    assert attrs["subagents.status"] == "error"
    assert span.status.status_code is StatusCode.ERROR
    assert "bad input" in (span.status.description or "")
    exc = [e for e in span.events if e.name == "exception"]
    assert exc
    assert dict(exc[0].attributes or {})["exception.type"] == "ValueError"


@pytest.mark.anyio
async def test_cancel_running_and_queued(exporter: InMemorySpanExporter) -> None:
    started = anyio.Event()

    async def waiting(request: Request, ctx: RunContext) -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError

    config = SubagentConfig(max_concurrent_spawns=1)
    async with SubagentManager([spec("waiting", waiting)], config=config) as manager:
        running = manager.spawn("waiting", name="running")
        queued = manager.spawn("waiting", name="queued")
        await started.wait()
        assert queued.cancel()
        assert running.cancel()
        assert (await running.wait()).status == "cancelled"
        assert (await queued.wait()).status == "cancelled"

    by_path = {
        dict(s.attributes or {})["subagents.agent_path"]: s
        for s in spans_named(exporter, "invoke_agent waiting")
    }
    assert set(by_path) == {"/root/running", "/root/queued"}
    for s in by_path.values():
        attrs = dict(s.attributes or {})
        assert attrs["error.type"] == "cancelled"
        assert attrs["subagents.status"] == "cancelled"
        assert s.status.status_code is StatusCode.UNSET
    assert event_names(by_path["/root/running"]) == ["queued", "started"]
    assert event_names(by_path["/root/queued"]) == ["queued"]


# --------------------------------------------------------------------------- metrics


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_metrics_count_durations_queue_waits_and_watchdog_fires(
    exporter: InMemorySpanExporter,
) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])

    async def stuck(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        raise AssertionError

    manager = SubagentManager(
        [spec("general"), spec("stuck", stuck)],
        config=SubagentConfig(meter_provider=provider),
    )
    async with manager:
        await manager.spawn("general").wait()
        await manager.execute("general")
        await manager.spawn("stuck", timeout=0.02).wait()

    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[object]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points[metric.name] = list(metric.data.data_points)
    durations = points["gen_ai.client.operation.duration"]
    by_error = {dict(p.attributes).get("error.type"): p for p in durations}  # type: ignore[attr-defined]
    assert by_error[None].count == 2  # type: ignore[attr-defined]
    assert by_error["timeout"].count == 1  # type: ignore[attr-defined]
    assert all(p.value == 0 for p in points["subagents.active"])  # type: ignore[attr-defined]
    assert sum(p.count for p in points["subagents.queue.wait"]) == 2  # type: ignore[attr-defined]
    (fired,) = points["subagents.watchdog.fired"]
    assert fired.value == 1  # type: ignore[attr-defined]
    provider.shutdown()
