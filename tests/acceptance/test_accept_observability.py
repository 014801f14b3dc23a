"""Acceptance tests for observability (issue 4), written from README.observability.md and
design/observability.md: spans through the SDK's in-memory exporter, the lifecycle event
stream, the JSONL sink and ``subagents events summary``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry import baggage, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from subagents import (
    AgentSpec,
    DelegateResult,
    Event,
    EventBus,
    JsonlSink,
    Request,
    Result,
    RunContext,
    Status,
    SubagentConfig,
    SubagentManager,
    Usage,
    read_events,
)
from subagents.tools import build_tools

pytestmark = pytest.mark.anyio


class CustomFailure(Exception):
    pass


# --- an SDK provider with an in-memory exporter ---------------------------------------------


class _Switch(InMemorySpanExporter):
    """Records only while these tests run (the global provider may be shared)."""

    on = False

    def export(self, spans: Any) -> Any:
        if self.on:
            return super().export(spans)
        return None


@pytest.fixture(scope="module")
def _exporter() -> Iterator[_Switch]:
    from opentelemetry.util._once import Once

    installed_here = isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    if installed_here:
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = _Switch()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.on = False
    if installed_here:
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans(_exporter: _Switch) -> Iterator[_Switch]:
    _exporter.clear()
    _exporter.on = True
    yield _exporter
    _exporter.on = False
    _exporter.clear()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = named(exporter, name)
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


# --- runners -------------------------------------------------------------------------------


async def echo(request: Request, ctx: RunContext) -> Result:
    ctx.report(iterations=1)
    return Result(output=f"echo {request.input}", usage=Usage(input_tokens=11, output_tokens=7))


async def boom(request: Request, ctx: RunContext) -> str:
    raise CustomFailure("went wrong")


async def forever(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    return ""


def agents(**extra: Any) -> list[AgentSpec]:
    return [
        AgentSpec(
            name="echo",
            description="Echoes.",
            runner=echo,
            model="gpt-test",
            provider="openai",
        ),
        AgentSpec(name="boom", description="Fails.", runner=boom),
        AgentSpec(name="forever", description="Never ends.", runner=forever),
        *extra.values(),
    ]


# --- spans ---------------------------------------------------------------------------------


async def test_invoke_agent_span_attributes(spans: _Switch) -> None:
    async with SubagentManager(agents()) as m:
        env = await m.spawn("echo", "hello").wait()
    span = one(spans, "invoke_agent echo")
    assert span.kind == SpanKind.INTERNAL
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == "echo"
    assert attrs["gen_ai.agent.id"] == env.task_id
    assert attrs["gen_ai.agent.description"] == "Echoes."
    assert attrs["gen_ai.conversation.id"] == "root"
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


async def test_no_model_and_the_default_provider_when_the_spec_has_none(spans: _Switch) -> None:
    async with SubagentManager(agents()) as m:
        await m.spawn("boom", "x").wait()
    attrs = dict(one(spans, "invoke_agent boom").attributes or {})
    assert "gen_ai.request.model" not in attrs
    # gen_ai.provider.name is Required on invoke_agent: the documented default stands in.
    assert attrs["gen_ai.provider.name"] == "subagents"


async def test_error_span(spans: _Switch) -> None:
    async with SubagentManager(agents()) as m:
        env = await m.spawn("boom", "x").wait()
    assert env.status == Status.ERROR
    span = one(spans, "invoke_agent boom")
    attrs = dict(span.attributes or {})
    assert span.status.status_code == StatusCode.ERROR
    # "the exception's qualified class name": module-qualified or bare both read as that
    assert str(attrs["error.type"]).endswith("CustomFailure")
    assert attrs["subagents.status"] == "error"
    assert "exception" in [e.name for e in span.events]


async def test_timeout_span(spans: _Switch) -> None:
    async with SubagentManager(agents()) as m:
        env = await m.spawn("forever", "x", timeout=0.03).wait()
    assert env.status == Status.TIMEOUT
    span = one(spans, "invoke_agent forever")
    attrs = dict(span.attributes or {})
    assert attrs["error.type"] == "timeout"
    assert attrs["subagents.status"] == "timeout"
    assert span.status.status_code == StatusCode.ERROR
    assert "watchdog.fired" in [e.name for e in span.events]


async def test_cancel_span(spans: _Switch) -> None:
    async with SubagentManager(agents()) as m:
        h = m.spawn("forever", "x")
        await anyio.wait_all_tasks_blocked()
        h.cancel()
        await h.wait()
    span = one(spans, "invoke_agent forever")
    attrs = dict(span.attributes or {})
    assert attrs["error.type"] == "cancelled"
    assert attrs["subagents.status"] == "cancelled"
    assert span.status.status_code != StatusCode.ERROR


async def test_cancel_while_queued_still_ends_its_span(spans: _Switch) -> None:
    config = SubagentConfig(max_concurrent_spawns=1)
    async with SubagentManager(agents(), config=config) as m:
        blocker = m.spawn("forever", "x")
        queued = m.spawn("echo", "never")
        queued.cancel()
        await queued.wait()
        blocker.cancel()
    span = one(spans, "invoke_agent echo")
    assert dict(span.attributes or {})["subagents.status"] == "cancelled"


async def test_child_span_parent_is_the_spawn_time_span(spans: _Switch) -> None:
    tracer = trace.get_tracer("acceptance")
    async with SubagentManager(agents()) as m:  # long-lived, entered outside any span
        with tracer.start_as_current_span("agent turn") as turn:
            h = m.spawn("echo", "x")
        with tracer.start_as_current_span("unrelated"):
            await h.wait()
    child = one(spans, "invoke_agent echo")
    assert parent_id(child) == turn.get_span_context().span_id
    assert child.context.trace_id == turn.get_span_context().trace_id


async def test_spawn_outside_any_span_is_a_root(spans: _Switch) -> None:
    tracer = trace.get_tracer("acceptance")
    async with SubagentManager(agents()) as m:
        with tracer.start_as_current_span("manager's own"):
            pass
        await m.spawn("echo", "x").wait()
    assert one(spans, "invoke_agent echo").parent is None


async def test_three_levels_deep_the_tree_is_intact(spans: _Switch) -> None:
    async def top(request: Request, ctx: RunContext) -> str:
        return (await ctx.spawn("mid", "x").wait()).output

    async def mid(request: Request, ctx: RunContext) -> str:
        return (await ctx.execute("leaf", "y")).output

    async def leaf(request: Request, ctx: RunContext) -> str:
        return "leaf"

    specs = [
        AgentSpec(name="top", description="top", runner=top),
        AgentSpec(name="mid", description="mid", runner=mid),
        AgentSpec(name="leaf", description="leaf", runner=leaf),
    ]
    tracer = trace.get_tracer("acceptance")
    async with SubagentManager(specs) as m:
        with tracer.start_as_current_span("agent turn") as turn:
            env = await m.spawn("top", "x", session_id="conv-1").wait()
    assert env.output == "leaf"
    t, mi, le = (one(spans, f"invoke_agent {n}") for n in ("top", "mid", "leaf"))
    assert parent_id(t) == turn.get_span_context().span_id
    assert parent_id(mi) == t.context.span_id
    assert parent_id(le) == mi.context.span_id
    trace_ids = {s.context.trace_id for s in (t, mi, le)}
    assert trace_ids == {turn.get_span_context().trace_id}
    for s in (t, mi, le):
        assert dict(s.attributes or {})["gen_ai.conversation.id"] == "conv-1"
    assert dict(le.attributes or {})["subagents.agent_path"] == "/root/top/mid/leaf"
    assert dict(le.attributes or {})["subagents.mode"] == "execute"
    assert dict(mi.attributes or {})["subagents.mode"] == "spawn"


async def test_usage_is_never_double_counted(spans: _Switch) -> None:
    async def parent(request: Request, ctx: RunContext) -> Result:
        await ctx.spawn("echo", "x").wait()
        return Result(output="p", usage=Usage(input_tokens=100, output_tokens=1))

    async with SubagentManager(
        [*agents(), AgentSpec(name="parent", description="p", runner=parent)]
    ) as m:
        env = await m.spawn("parent", "x").wait()
    assert env.usage == Usage(input_tokens=100, output_tokens=1)
    attrs = dict(one(spans, "invoke_agent parent").attributes or {})
    assert attrs["gen_ai.usage.input_tokens"] == 100
    assert attrs["gen_ai.usage.output_tokens"] == 1


async def test_execute_span(spans: _Switch) -> None:
    tracer = trace.get_tracer("acceptance")
    async with SubagentManager(agents()) as m:
        with tracer.start_as_current_span("turn") as turn:
            await m.execute("echo", "x")
    span = one(spans, "invoke_agent echo")
    assert parent_id(span) == turn.get_span_context().span_id
    assert dict(span.attributes or {})["subagents.mode"] == "execute"


async def test_baggage_inside_a_child(spans: _Switch) -> None:
    seen: dict[str, Any] = {}

    async def probe(request: Request, ctx: RunContext) -> str:
        for key in ("gen_ai.conversation.id", "subagents.agent_path", "subagents.task_id"):
            seen[key] = baggage.get_baggage(key)
        seen["task_id"] = ctx.task_id
        return ""

    async with SubagentManager([AgentSpec(name="probe", description="p", runner=probe)]) as m:
        await m.spawn("probe", "x", session_id="conv-9").wait()
    assert seen["gen_ai.conversation.id"] == "conv-9"
    assert seen["subagents.agent_path"] == "/root/probe"
    assert seen["subagents.task_id"] == seen["task_id"]


async def test_capture_content_records_prompt_and_output(spans: _Switch) -> None:
    config = SubagentConfig(capture_content=True)
    async with SubagentManager(agents(), config=config) as m:
        await m.spawn("echo", "secret prompt").wait()
    attrs = dict(one(spans, "invoke_agent echo").attributes or {})
    assert "secret prompt" in str(attrs.get("gen_ai.input.messages"))
    assert "echo secret prompt" in str(attrs.get("gen_ai.output.messages"))


async def test_tracing_off_records_nothing(spans: _Switch) -> None:
    async with SubagentManager(agents(), config=SubagentConfig(tracing=False)) as m:
        await m.spawn("echo", "x").wait()
    assert named(spans, "invoke_agent echo") == []


async def test_tool_spans_transfer_and_links(spans: _Switch) -> None:
    async with SubagentManager(agents()) as m:
        toolset = build_tools(m, "root")
        r1 = await toolset.call("spawn_agent", {"agent": "echo", "input": "a"}, call_id="call_1")
        r2 = await toolset.call("spawn_agent", {"agent": "echo", "input": "b"}, call_id="call_2")
        ids = [r1.details["task_id"], r2.details["task_id"]]
        w = await toolset.call("wait_agent", {"task_ids": ids, "timeout_ms": 2000}, call_id="w")
        assert w.details["completed"] is True
        await toolset.call("delegate_to_agent", {"agent": "echo", "input": "c"})
    spawn_spans = named(spans, "execute_tool spawn_agent")
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
        dict(s.attributes or {})["gen_ai.agent.id"]: s for s in named(spans, "invoke_agent echo")
    }
    assert len(children) == 3
    spawn_ids = {s.context.span_id for s in spawn_spans}
    assert {parent_id(children[i]) for i in ids} == spawn_ids
    wait = one(spans, "execute_tool wait_agent")
    assert "subagents.transfer.mode" not in dict(wait.attributes or {})
    linked = {link.context.span_id for link in wait.links}
    assert linked == {children[i].context.span_id for i in ids}
    delegate = one(spans, "execute_tool delegate_to_agent")
    assert dict(delegate.attributes or {})["subagents.transfer.target.name"] == "echo"
    (delegated,) = [s for i, s in children.items() if i not in ids]
    assert parent_id(delegated) == delegate.context.span_id
    for s in spans.get_finished_spans():
        assert "gen_ai.system" not in dict(s.attributes or {})


async def test_tool_call_id_absent_when_not_passed(spans: _Switch) -> None:
    async with SubagentManager(agents()) as m:
        await build_tools(m, "root").call("list_agents", {})
    attrs = dict(one(spans, "execute_tool list_agents").attributes or {})
    assert "gen_ai.tool.call.id" not in attrs
    assert attrs["gen_ai.tool.name"] == "list_agents"


def test_metrics_through_the_api(tmp_path: Path) -> None:
    """Run in a fresh interpreter: a global MeterProvider can be set once per process."""
    script = textwrap.dedent(
        """
        import anyio
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from subagents import AgentSpec, SubagentManager

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

        async def forever(request, ctx):
            await anyio.sleep_forever()

        async def ok(request, ctx):
            return "ok"

        async def main():
            specs = [AgentSpec(name="ok", runner=ok), AgentSpec(name="forever", runner=forever)]
            async with SubagentManager(specs) as m:
                await m.spawn("ok", "x").wait()
                await m.spawn("forever", "x", timeout=0.02).wait()

        anyio.run(main)
        names = set()
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    names.add(metric.name)
        print(sorted(names))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr
    for name in (
        "gen_ai.client.operation.duration",
        "subagents.active",
        "subagents.queue.wait",
        "subagents.watchdog.fired",
    ):
        assert name in out.stdout


# --- lifecycle events ----------------------------------------------------------------------


async def test_event_schema_for_one_spawn() -> None:
    async def worker(request: Request, ctx: RunContext) -> str:
        ctx.report(output="half", iterations=1)
        return "full output " + "z" * 3000

    events: list[Event] = []
    m = SubagentManager([AgentSpec(name="worker", description="w", runner=worker)])
    m.events.subscribe(events.append)
    async with m:
        env = await m.spawn("worker", "x", session_id="s7").wait()
    types = [e.type for e in events]
    assert types[0] == "subagent.spawned"
    assert types[1] == "subagent.started"
    assert "subagent.progress" in types
    assert types[-1] == "subagent.completed"
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    for e in events:
        assert isinstance(e.timestamp_ms, int)
        assert e.session_id == "s7"
        assert e.task_id == env.task_id
        assert e.agent_path == "/root/worker"
        line = e.to_dict()
        assert set(line) >= {"type", "seq", "timestamp_ms", "session_id", "task_id", "agent_path"}
        assert json.loads(e.to_json()) == line
    completed = events[-1]
    assert completed.data == env.to_dict()
    assert DelegateResult.from_dict(completed.data) == env
    assert len(completed.data["output"]) > 3000  # untruncated
    spawned = events[0].data
    assert spawned["agent"] == "worker"
    assert spawned["mode"] == "spawn"


async def test_seq_strictly_increases_across_many_children() -> None:
    events: list[Event] = []
    m = SubagentManager(agents(), config=SubagentConfig(max_concurrent_spawns=8))
    m.events.subscribe(events.append)
    async with m:
        handles = [m.spawn("echo", str(i)) for i in range(30)]
        for h in handles:
            await h.wait()
    seqs = [e.seq for e in events]
    assert all(a < b for a, b in itertools.pairwise(seqs))
    assert sum(e.type == "subagent.completed" for e in events) == 30


async def test_a_raising_subscriber_never_breaks_the_runtime() -> None:
    def bad(event: Event) -> None:
        raise RuntimeError("subscriber bug")

    m = SubagentManager(agents())
    m.events.subscribe(bad)
    async with m:
        env = await m.spawn("echo", "x").wait()
    assert env.status == Status.COMPLETED


async def test_unsubscribe() -> None:
    events: list[Event] = []
    m = SubagentManager(agents())
    stop = m.events.subscribe(events.append)
    async with m:
        await m.spawn("echo", "x").wait()
        n = len(events)
        stop()
        await m.spawn("echo", "y").wait()
    assert len(events) == n > 0


async def test_stream_yields_events() -> None:
    got: list[Event] = []
    async with SubagentManager(agents()) as m, m.events.stream(max_buffer=1024) as stream:
        env = await m.spawn("echo", "x").wait()
        with anyio.fail_after(2):
            async for event in stream:
                got.append(event)
                if event.type == "subagent.completed":
                    break
    assert next(e.type for e in got) == "subagent.spawned"
    assert got[-1].data == env.to_dict()


async def test_stream_overflow_reports_missed_events() -> None:
    bus = EventBus()
    async with bus.stream(max_buffer=3) as stream:
        for i in range(10):
            bus.publish("subagent.progress", session_id="s", task_id=f"t{i}", agent_path="/root/x")
        got: list[Event] = []
        with anyio.fail_after(2):
            async for event in stream:
                got.append(event)
                if len(got) == 4:
                    break
        bus.publish("subagent.progress", session_id="s", task_id="after", agent_path="/root/x")
        with anyio.fail_after(2):
            async for event in stream:
                got.append(event)
                break
    types = [e.type for e in got]
    assert types[:3] == ["subagent.progress"] * 3
    assert types[3] == "subagent.missed"
    missed = got[3].data
    assert missed["missed"] == 7
    assert missed["first_seq"] == got[2].seq + 1
    assert missed["last_seq"] == missed["first_seq"] + 6
    assert got[4].task_id == "after"


async def test_a_stream_nobody_reads_never_blocks_the_runtime() -> None:
    config = SubagentConfig(max_concurrent_spawns=16)
    async with SubagentManager(agents(), config=config) as m, m.events.stream(max_buffer=1):
        with anyio.fail_after(5):
            handles = [m.spawn("echo", str(i)) for i in range(100)]
            for h in handles:
                await h.wait()


# --- JSONL sink ----------------------------------------------------------------------------


async def test_jsonl_sink_and_read_events(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    async with SubagentManager(agents()) as m:
        with JsonlSink(path) as sink:
            sink.attach(m.events)
            env = await m.spawn("echo", "x").wait()
            size = path.stat().st_size
            assert size > 0  # written at once, no buffering
        await m.spawn("echo", "after close").wait()
    lines = path.read_text().splitlines()
    assert all(json.loads(line) for line in lines)
    events = list(read_events(path))
    assert [e.to_dict() for e in events] == [json.loads(line) for line in lines]
    assert events[-1].type == "subagent.completed"
    assert events[-1].data == env.to_dict()
    assert path.stat().st_size == size  # nothing written after the sink closed


async def test_jsonl_sink_as_a_plain_subscriber(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    async with SubagentManager(agents()) as m:
        with JsonlSink(str(path)) as sink:
            m.events.subscribe(sink)
            await m.spawn("echo", "x").wait()
    assert len(list(read_events(path))) >= 3


def test_partial_last_line_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events.jsonl"
    good = Event(
        type="subagent.spawned",
        seq=1,
        timestamp_ms=1,
        session_id="root",
        task_id="t1",
        agent_path="/root/a",
        data={"agent": "a"},
    )
    with path.open("wb") as f:
        f.write(good.to_json() + b"\n")
        f.write(b'{"type": "subagent.completed", "seq": 2, "timest')
    with caplog.at_level(logging.WARNING):
        events = list(read_events(path))
    assert [e.to_dict() for e in events] == [good.to_dict()]
    assert any(r.levelno >= logging.WARNING for r in caplog.records)


# --- CLI -----------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-m", "subagents", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


async def _write_log(path: Path) -> dict[str, DelegateResult]:
    async def slow(request: Request, ctx: RunContext) -> Result:
        await anyio.sleep(0.05)
        return Result(output="slow", usage=Usage(input_tokens=5, output_tokens=5))

    specs = [*agents(), AgentSpec(name="slow", description="s", runner=slow)]
    out: dict[str, DelegateResult] = {}
    async with SubagentManager(specs) as m:
        with JsonlSink(path) as sink:
            sink.attach(m.events)
            for name in ("echo", "echo", "echo", "boom", "slow"):
                env = await m.spawn(name, "x").wait()
                out[env.task_id] = env
            env = await m.spawn("forever", "x", timeout=0.02).wait()
            out[env.task_id] = env
            unfinished = m.spawn("forever", "x")
            await anyio.wait_all_tasks_blocked()
        unfinished.cancel()
    return out


async def test_events_summary_cli(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    envs = await _write_log(path)
    text = _cli("events", "summary", str(path))
    assert text.returncode == 0, text.stderr
    out = text.stdout
    for needle in ("completed", "error", "timeout", "echo", "boom", "slow", "p50", "p95", "max"):
        assert needle in out, needle
    failed = [e for e in envs.values() if e.status != Status.COMPLETED]
    for env in failed:
        assert env.task_id in out  # the failed tasks are listed
    slowest = max(envs.values(), key=lambda e: e.duration_ms)
    assert slowest.task_id in out
    echo_line = next(line for line in out.splitlines() if line.strip().startswith("echo"))
    assert "33" in echo_line
    assert "21" in echo_line
    assert "unfinished" in out
    as_json = _cli("events", "summary", str(path), "--json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert isinstance(data, dict)
    blob = json.dumps(data)
    assert "echo" in blob
    assert "boom" in blob


async def test_events_tail_cli_no_follow(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    envs = await _write_log(path)
    out = _cli("events", "tail", str(path), "--no-follow")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == len(list(read_events(path)))
    for env in envs.values():
        assert env.task_id in out.stdout


def test_events_summary_of_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    out = _cli("events", "summary", str(tmp_path / "nope.jsonl"))
    assert out.returncode != 0
    assert "nope.jsonl" in out.stderr
    assert "Traceback" not in out.stderr


async def test_tool_spans_inside_a_child_nest_under_it(spans: _Switch) -> None:
    async def parent(request: Request, ctx: RunContext) -> str:
        toolset = build_tools(ctx.manager, ctx.session_id)
        r = await toolset.call("spawn_agent", {"agent": "echo", "input": "inner"})
        await toolset.call("wait_agent", {"task_ids": [r.details["task_id"]]})
        return "ok"

    async with SubagentManager(
        [*agents(), AgentSpec(name="parent", description="p", runner=parent)]
    ) as m:
        await m.spawn("parent", "x", session_id="conv-3").wait()
    outer = one(spans, "invoke_agent parent")
    tool = one(spans, "execute_tool spawn_agent")
    inner = one(spans, "invoke_agent echo")
    assert parent_id(tool) == outer.context.span_id
    assert parent_id(inner) == tool.context.span_id
    assert dict(tool.attributes or {})["gen_ai.conversation.id"] == "conv-3"
    assert dict(inner.attributes or {})["gen_ai.conversation.id"] == "conv-3"


async def test_spawned_and_started_event_data() -> None:
    events: list[Event] = []
    m = SubagentManager(agents())
    m.events.subscribe(events.append)
    async with m:
        await m.spawn("echo", "x", timeout=7.5).wait()
    spawned = next(e for e in events if e.type == "subagent.spawned")
    started = next(e for e in events if e.type == "subagent.started")
    assert spawned.data["parent_path"] == "/root"
    assert spawned.data["timeout_s"] == 7.5
    assert isinstance(started.data["queue_ms"], int)


def test_events_tail_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "subagents", "events", "tail", str(path), "--max-events", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        with JsonlSink(path) as sink:
            for i in range(2):
                event = Event(
                    type="subagent.spawned",
                    seq=i + 1,
                    timestamp_ms=1,
                    session_id="root",
                    task_id=f"task{i}",
                    agent_path="/root/a",
                    data={"agent": "a"},
                )
                sink.write_line(event.to_json())
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert len(lines) == 2
    assert "task0" in lines[0]
    assert "task1" in lines[1]


def test_without_the_sdk_nothing_breaks() -> None:
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
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fine", "fine"]
