"""What the tracing tests share: looking spans up, and specs whose runners echo or fail."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from subagents import AgentSpec, Request, Result, RunContext, Usage


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


async def broken(request: Request, ctx: RunContext) -> str:
    raise ValueError("disk on fire")
