"""The spans of tool calls: parentage, links, errors, bounded names."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from subagents import (
    Request,
    RunContext,
    SubagentConfig,
    SubagentManager,
)
from subagents._tool_tracing import tool_span
from subagents.tools import build_tools
from tests.tracing.support import (
    broken,
    no_gen_ai_system,
    one,
    parent_id,
    span_id,
    spans_named,
    spec,
    tracer,
)

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
    async with SubagentManager([spec("general"), spec("broken", broken)]) as manager:
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
