"""OpenTelemetry spans: names, kinds, parentage, attributes, links, baggage, metrics.

The global tracer provider can be set only once per process, so this module installs an
SDK provider if none is set (and unsets it again afterwards), or reuses the SDK one another
module installed, and adds a gated in-memory exporter that only records while these tests
run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import pytest
from opentelemetry import baggage, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from subagents import (
    AgentSpec,
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
from subagents._tool_tracing import tool_span
from subagents.tools import build_tools
from tests.helpers import clock_backends


class _Gate(SpanProcessor):
    """Forwards ended spans to the exporter only while open."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.open = False

    def on_start(self, span: object, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.open:
            self.exporter.export([span])

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _reset_global_tracer_provider() -> None:
    # private: OpenTelemetry has no public way to unset the global provider (the API
    # allows setting it once). This is what its own test utilities do, so that a later
    # test module can install its own.
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def _gate() -> Iterator[_Gate]:
    installed_here = isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    if installed_here:
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # pragma: no cover - foreign provider
        pytest.skip("a non-SDK tracer provider is installed globally")
    gate = _Gate(InMemorySpanExporter())
    provider.add_span_processor(gate)
    gate.open = True
    yield gate
    gate.open = False
    gate.exporter.clear()
    if installed_here:
        _reset_global_tracer_provider()


@pytest.fixture
def exporter(_gate: _Gate) -> InMemorySpanExporter:
    _gate.exporter.clear()
    return _gate.exporter


def tracer() -> trace.Tracer:
    return trace.get_tracer("tests")


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = spans_named(exporter, name)
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def event_names(span: ReadableSpan) -> list[str]:
    return [e.name for e in span.events]


async def echo(request: Request, ctx: RunContext) -> Result:
    return Result(output=f"echo {request.input}", usage=Usage(input_tokens=3, output_tokens=5))


def spec(name: str, runner: object = echo, **kw: object) -> AgentSpec:
    return AgentSpec(name=name, description=f"{name} agent", runner=runner, **kw)  # type: ignore[arg-type]


def no_gen_ai_system(spans: Sequence[ReadableSpan]) -> None:
    for s in spans:
        assert s.attributes is not None
        assert "gen_ai.system" not in s.attributes


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
    async with SubagentManager([spec("boom", _broken)]) as m:
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


# --------------------------------------------------------------------------- tool spans


@pytest.mark.anyio
async def test_tool_spans_parent_and_links(exporter: InMemorySpanExporter) -> None:
    async with SubagentManager(
        [spec("general")], config=SubagentConfig(tracing=False)
    ) as untraced_manager:
        untraced = untraced_manager.spawn("general", "c")
        await untraced.wait()
    async with SubagentManager([spec("general")]) as manager:
        with tracer().start_as_current_span("agent turn"):
            with tool_span("spawn_agent", call_id="call-1", transfer_target="general"):
                first = manager.spawn("general", "a")
            with tool_span("spawn_agent", call_id="call-2", transfer_target="general"):
                second = manager.spawn("general", "b")
            await first.wait()
            await second.wait()
            with tool_span("wait_agent", call_id="call-3") as span:
                assert span.recording
                span.link_tasks([first, second, untraced])  # an untraced child is skipped
                span.set_attribute("subagents.collected", 2)

    spawns = spans_named(exporter, "execute_tool spawn_agent")
    assert len(spawns) == 2
    turn = one(exporter, "agent turn")
    children = spans_named(exporter, "invoke_agent general")
    assert {parent_id(c) for c in children} == {span_id(s) for s in spawns}
    for s in spawns:
        assert parent_id(s) == span_id(turn)
        assert s.kind is SpanKind.INTERNAL
        attrs = dict(s.attributes or {})
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert attrs["gen_ai.tool.name"] == "spawn_agent"
        assert attrs["gen_ai.tool.type"] == "function"
        assert attrs["subagents.transfer.mode"] == "return_to_caller"
        assert attrs["subagents.transfer.target.name"] == "general"
        assert attrs["subagents.transfer.target.type"] == "agent"
    assert {dict(s.attributes or {})["gen_ai.tool.call.id"] for s in spawns} == {
        "call-1",
        "call-2",
    }
    wait = one(exporter, "execute_tool wait_agent")
    attrs = dict(wait.attributes or {})
    assert "subagents.transfer.mode" not in attrs
    assert attrs["subagents.collected"] == 2
    linked = {link.context.span_id for link in wait.links}
    assert linked == {span_id(c) for c in children}
    no_gen_ai_system(exporter.get_finished_spans())


@pytest.mark.anyio
async def test_real_tool_calls_parent_and_link_the_child_spans(
    exporter: InMemorySpanExporter,
) -> None:
    async with SubagentManager([spec("echo")]) as m:
        toolset = build_tools(m, "root")
        r1 = await toolset.call("spawn_agent", {"agent": "echo", "input": "a"}, call_id="call_1")
        r2 = await toolset.call("spawn_agent", {"agent": "echo", "input": "b"}, call_id="call_2")
        ids = [r1.details["task_id"], r2.details["task_id"]]
        w = await toolset.call("wait_agent", {"task_ids": ids, "timeout_ms": 2000}, call_id="w")
        assert w.details["completed"] is True
        await toolset.call("delegate_to_agent", {"agent": "echo", "input": "c"})
    spawn_spans = spans_named(exporter, "execute_tool spawn_agent")
    assert len(spawn_spans) == 2
    for s in spawn_spans:
        attrs = dict(s.attributes or {})
        assert s.kind == SpanKind.INTERNAL
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert attrs["gen_ai.tool.name"] == "spawn_agent"
        assert attrs["gen_ai.tool.type"] == "function"
        assert attrs["subagents.transfer.mode"] == "return_to_caller"
        assert attrs["subagents.transfer.target.name"] == "echo"
        assert attrs["subagents.transfer.target.type"] == "agent"
    assert {dict(s.attributes or {})["gen_ai.tool.call.id"] for s in spawn_spans} == {
        "call_1",
        "call_2",
    }
    children = {
        dict(s.attributes or {})["gen_ai.agent.id"]: s
        for s in spans_named(exporter, "invoke_agent echo")
    }
    assert len(children) == 3
    spawn_ids = {span_id(s) for s in spawn_spans}
    assert {parent_id(children[i]) for i in ids} == spawn_ids
    wait = one(exporter, "execute_tool wait_agent")
    assert "subagents.transfer.mode" not in dict(wait.attributes or {})
    linked = {link.context.span_id for link in wait.links}
    assert linked == {span_id(children[i]) for i in ids}
    delegate = one(exporter, "execute_tool delegate_to_agent")
    assert dict(delegate.attributes or {})["subagents.transfer.target.name"] == "echo"
    (delegated,) = [s for i, s in children.items() if i not in ids]
    assert parent_id(delegated) == span_id(delegate)
    no_gen_ai_system(exporter.get_finished_spans())


@pytest.mark.anyio
async def test_tool_call_id_absent_when_not_passed(exporter: InMemorySpanExporter) -> None:
    async with SubagentManager([spec("echo")]) as m:
        await build_tools(m, "root").call("list_agents", {})
    attrs = dict(one(exporter, "execute_tool list_agents").attributes or {})
    assert "gen_ai.tool.call.id" not in attrs
    assert attrs["gen_ai.tool.name"] == "list_agents"


@pytest.mark.anyio
async def test_tool_spans_inside_a_child_nest_under_it(exporter: InMemorySpanExporter) -> None:
    async def parent(request: Request, ctx: RunContext) -> str:
        toolset = build_tools(ctx.manager, ctx.session_id)
        r = await toolset.call("spawn_agent", {"agent": "echo", "input": "inner"})
        await toolset.call("wait_agent", {"task_ids": [r.details["task_id"]]})
        return "ok"

    async with SubagentManager([spec("echo"), spec("parent", parent)]) as m:
        await m.spawn("parent", "x", session_id="conv-3").wait()
    outer = one(exporter, "invoke_agent parent")
    tool = one(exporter, "execute_tool spawn_agent")
    inner = one(exporter, "invoke_agent echo")
    assert parent_id(tool) == span_id(outer)
    assert parent_id(inner) == span_id(tool)
    assert dict(tool.attributes or {})["gen_ai.conversation.id"] == "conv-3"
    assert dict(inner.attributes or {})["gen_ai.conversation.id"] == "conv-3"


@pytest.mark.anyio
async def test_tool_span_inside_child_and_on_error(exporter: InMemorySpanExporter) -> None:
    async def with_tool(request: Request, ctx: RunContext) -> str:
        with tool_span("read_file", call_id="t1") as span:
            span.set_error("FileNotFound", "no such file")
        with pytest.raises(KeyError), tool_span("crash"):
            raise KeyError("x")
        return "done"

    async with SubagentManager([spec("tooled", with_tool)]) as manager:
        await manager.execute("tooled", session_id="conv-9")
    child = one(exporter, "invoke_agent tooled")
    read = one(exporter, "execute_tool read_file")
    crash = one(exporter, "execute_tool crash")
    assert parent_id(read) == span_id(child)
    assert parent_id(crash) == span_id(child)
    assert dict(read.attributes or {})["gen_ai.conversation.id"] == "conv-9"
    assert dict(read.attributes or {})["error.type"] == "FileNotFound"
    assert read.status.status_code is StatusCode.ERROR
    assert crash.status.status_code is StatusCode.ERROR
    assert dict(crash.attributes or {})["error.type"] == "KeyError"


async def _broken(request: Request, ctx: RunContext) -> str:
    raise ValueError("disk on fire")


# Each case: tool name, arguments, the expected error.type of its execute_tool span.
TOOL_ERRORS = {
    "unknown agent": ("spawn_agent", {"agent": "nobody", "input": "x"}, "unknown_agent"),
    "invalid arguments": ("spawn_agent", {"agent": "general"}, "invalid_arguments"),
    "arguments not JSON": ("spawn_agent", "{not json", "invalid_arguments"),
    "unknown task id": ("wait_agent", {"task_ids": ["nope"]}, "unknown_task"),
    "unknown task ids": ("wait_agent", {"task_ids": ["nope", "nada"]}, "unknown_task"),
    "cancel unknown task": ("cancel_agent", {"task_id": "nope"}, "unknown_task"),
    "unknown tool": ("no_such_tool", {}, "unknown_tool"),
    "failed delegate, string mode": (
        "delegate_to_agent",
        {"agent": "broken", "input": "x"},
        "ValueError",
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(TOOL_ERRORS))
async def test_tool_error_results_mark_their_span(
    exporter: InMemorySpanExporter, case: str
) -> None:
    tool, args, error_type = TOOL_ERRORS[case]
    async with SubagentManager([spec("general"), spec("broken", _broken)]) as manager:
        tools = build_tools(manager, "root", return_mode="string")
        result = await tools.call(tool, args, call_id="c1")
    assert result.is_error
    span = one(exporter, f"execute_tool {tool}")
    attrs = dict(span.attributes or {})
    assert attrs["error.type"] == error_type
    assert span.status.status_code is StatusCode.ERROR
    description = span.status.description or ""
    assert description
    assert description in result.content or result.content.startswith(description[:-1])


@pytest.mark.anyio
async def test_tool_internal_failure_marks_its_span_with_the_exception_class(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_spawn(*args: object, **kwargs: object) -> None:
        raise RuntimeError("manager bug")

    async with SubagentManager([spec("general")]) as manager:
        monkeypatch.setattr(manager, "spawn", broken_spawn)
        result = await build_tools(manager, "root").call(
            "spawn_agent", {"agent": "general", "input": "x"}
        )
    assert result.is_error
    assert result.details["error"] == "internal"
    span = one(exporter, "execute_tool spawn_agent")
    assert dict(span.attributes or {})["error.type"] == "RuntimeError"
    assert span.status.status_code is StatusCode.ERROR


@pytest.mark.anyio
async def test_tool_successes_leave_their_span_unset(exporter: InMemorySpanExporter) -> None:
    async with SubagentManager([spec("general")]) as manager:
        tools = build_tools(manager, "root", return_mode="string")
        spawned = await tools.call("spawn_agent", {"agent": "general", "input": "x"})
        task_id = spawned.details["task_id"]
        waited = await tools.call("wait_agent", {"task_ids": [task_id], "timeout_ms": 5000})
        delegated = await tools.call("delegate_to_agent", {"agent": "general", "input": "y"})
        timed_out = await tools.call("wait_agent", {"task_ids": [task_id], "timeout_ms": 0})
    assert not any(r.is_error for r in (spawned, waited, delegated, timed_out))
    tool_spans = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    assert len(tool_spans) == 4
    for span in tool_spans:
        assert span.status.status_code is StatusCode.UNSET, span.name
        assert "error.type" not in dict(span.attributes or {})


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


# --------------------------------------------------------------------------- no SDK


def test_no_sdk_installed_nothing_breaks() -> None:
    script = textwrap.dedent(
        """
        import anyio
        from subagents import AgentSpec, SubagentManager, Result, Usage
        from subagents._handle import record_of
        from subagents._manager import telemetry_of
        from subagents._tool_tracing import tool_span

        async def runner(request, ctx):
            with tool_span("read_file", call_id="x") as span:
                span.set_attribute("k", 1)
                span.link_tasks([])
                span.set_error("E")
            h = None
            if request.input == "outer":
                h = ctx.spawn("a", "inner")
                await h.wait()
            return Result(output="ok", usage=Usage(input_tokens=1))

        async def main():
            async with SubagentManager([AgentSpec(name="a", description="d", runner=runner)]) as m:
                # private: no public view of the manager's telemetry or a child's tracing
                # state; with no SDK provider installed neither is made.
                assert not telemetry_of(m).active
                h = m.spawn("a", "outer")
                assert record_of(h).trace is None
                assert (await h.wait()).status == "completed"
                assert (await m.execute("a", "outer")).status == "completed"
            with tool_span("wait_agent") as span:
                assert not span.recording

        async def late_provider():
            # A provider installed after the manager was built, before it is entered, is used.
            from opentelemetry import trace
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )

            m = SubagentManager([AgentSpec(name="a", description="d", runner=runner)])
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            # Likewise a global SDK meter provider (found by its public force_flush/shutdown).
            from opentelemetry import metrics
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader

            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            async with m:
                await m.spawn("a", "inner").wait()
            names = sorted(s.name for s in exporter.get_finished_spans())
            assert names == ["execute_tool read_file", "invoke_agent a"], names
            recorded = {
                metric.name
                for rm in reader.get_metrics_data().resource_metrics
                for sm in rm.scope_metrics
                for metric in sm.metrics
            }
            assert "gen_ai.client.operation.duration" in recorded, recorded

        anyio.run(main)
        anyio.run(late_provider)
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_without_the_sdk_installed_the_runtime_and_tools_work() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry.sdk"] = None  # as if the SDK were not installed
        import anyio
        from subagents import AgentSpec, SubagentManager
        from subagents.tools import build_tools

        async def ok(request, ctx):
            return "ok " + request.input

        async def main():
            async with SubagentManager([AgentSpec(name="ok", runner=ok)]) as m:
                env = await m.spawn("ok", "x").wait()
                assert env.output == "ok x", env
                tools = build_tools(m, "root")
                r = await tools.call("delegate_to_agent", {"agent": "ok", "input": "y"})
                assert not r.is_error, r.content
            print("fine")

        anyio.run(main)
        anyio.run(main, backend="trio")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fine", "fine"]


class _Exploding(SpanProcessor):
    """A span processor with a bug, at span start or at span end."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: object, parent_context: Context | None = None) -> None:
        if self.where == "start":
            raise RuntimeError("processor bug at start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "end":
            raise RuntimeError("processor bug at end")


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["start", "end"])
async def test_broken_tracing_never_loses_an_envelope(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(_Exploding(where))
    manager = SubagentManager([spec("general")], config=SubagentConfig(tracer_provider=provider))
    async with manager:
        handle = manager.spawn("general", "x")
        with anyio.fail_after(5):
            envelope = await handle.wait()
        assert (await manager.execute("general")).status == "completed"
    assert envelope.status == "completed"
    assert f"processor bug at {where}" in caplog.text


# --------------------------------------------------------------------------- providers


def _own_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    own = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(own))
    return provider, own


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
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    asked: list[str] = []

    class Counting:
        def get_tracer(self, name: str, *args: object) -> trace.Tracer:
            asked.append("tracer")
            return provider.get_tracer(name)

        def get_meter(self, name: str, *args: object) -> object:
            asked.append("meter")
            return meter_provider.get_meter(name)

    counting = Counting()
    config = SubagentConfig(tracer_provider=counting, meter_provider=counting)
    manager = SubagentManager([spec("general")], config=config)
    assert asked == []
    async with manager:
        for _ in range(3):
            await manager.spawn("general").wait()
    assert asked == ["tracer", "meter"]
    assert len(own.get_finished_spans()) == 3
    meter_provider.shutdown()


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
async def test_names_a_model_sends_are_bounded_in_tool_spans(
    exporter: InMemorySpanExporter,
) -> None:
    """An unknown tool, a made-up agent and a huge call id: none makes a span's name or
    attributes (or the tool's details) grow with what the model sent."""
    huge = "x" * 200_000
    async with SubagentManager([spec("general")]) as manager:
        tools = build_tools(manager, "root")
        unknown_tool = await tools.call(huge, {}, call_id=huge)
        unknown_agent = await tools.call("spawn_agent", {"agent": huge, "input": "hi"})
    assert unknown_tool.is_error
    assert unknown_agent.is_error
    assert len(str(unknown_agent.details)) < 1_000
    spans = exporter.get_finished_spans()
    assert spans
    for span in spans:
        assert len(span.name) < 200
        for key, value in (span.attributes or {}).items():
            assert len(str(value)) <= 4_096, key


@pytest.mark.anyio
async def test_tools_trace_with_the_managers_providers_resolved_once() -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    asked: list[str] = []

    class Counting:
        def get_tracer(self, name: str, *args: object) -> trace.Tracer:
            asked.append("tracer")
            return provider.get_tracer(name)

        def get_meter(self, name: str, *args: object) -> object:
            asked.append("meter")
            return meter_provider.get_meter(name)

    counting = Counting()
    config = SubagentConfig(tracer_provider=counting, meter_provider=counting)
    spec = AgentSpec(name="general", description="d", runner=_echo)
    async with SubagentManager([spec], config=config) as manager:
        for session in ("a", "b", "c"):
            await build_tools(manager, session).call("list_agents", {})
    assert asked == ["tracer", "meter"]
    assert [s.name for s in exported.get_finished_spans()].count("execute_tool list_agents") == 3


async def _echo(request: Request, ctx: RunContext) -> str:
    return request.input
