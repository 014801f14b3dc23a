"""Without the OpenTelemetry SDK, and with broken tracing: nothing breaks, nothing is lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from subagents import (
    SubagentConfig,
    SubagentManager,
)
from tests.tracing.support import (
    spec,
)

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
