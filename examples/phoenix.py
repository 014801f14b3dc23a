"""Send a run's spans to a local Arize Phoenix, the open-source LLM tracing UI.

    pip install arize-phoenix opentelemetry-exporter-otlp-proto-http
    phoenix serve                 # the UI at http://localhost:6006
    python examples/phoenix.py

In Phoenix: one trace per run, ``researcher`` with its two ``fact_checker`` children nested
under it (their paths and queue waits in each span's metadata), inputs and outputs shown,
the failed child marked red, and the tokens counted (``usage_spans``). All the spans of the
run share one session: the manager's conversation id, new for every run.
"""

from __future__ import annotations

import os

import anyio
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from subagents import (
    AgentSpec,
    Request,
    Result,
    RunContext,
    SubagentConfig,
    SubagentManager,
    Usage,
)

COLLECTOR = os.environ.get("PHOENIX_COLLECTOR_ENDPOINT", "http://localhost:6006")
ENDPOINT = COLLECTOR.rstrip("/") + "/v1/traces"


async def fact_checker(request: Request, ctx: RunContext) -> Result:
    await anyio.sleep(0.05)  # stands in for a model call
    if "moon" in request.input:
        raise ValueError(f"no source confirms {request.input!r}")
    usage = Usage(input_tokens=420, output_tokens=35)
    return Result(output=f"confirmed: {request.input}", usage=usage)


async def researcher(request: Request, ctx: RunContext) -> Result:
    claims = ["water boils at 100 °C at sea level", "the moon is made of cheese"]
    checks = [ctx.spawn("fact_checker", claim) for claim in claims]
    verdicts = [await check.wait() for check in checks]
    summary = "; ".join(f"{v.status.value}: {v.output or v.error}" for v in verdicts)
    return Result(output=summary, usage=Usage(input_tokens=1200, output_tokens=180))


AGENTS = [
    AgentSpec(name="researcher", runner=researcher, model="gpt-4o-mini", provider="openai"),
    AgentSpec(name="fact_checker", runner=fact_checker, model="gpt-4o-mini", provider="openai"),
]


async def main() -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=ENDPOINT)))
    config = SubagentConfig(tracer_provider=provider, capture_content=True, usage_spans=True)
    try:
        async with SubagentManager(AGENTS, config=config) as manager:
            tracer = provider.get_tracer("example")
            with tracer.start_as_current_span("agent turn"):
                envelope = await manager.spawn("researcher", "check two claims").wait()
            print(f"{envelope.status.value}: {envelope.output}")
    finally:
        provider.shutdown()  # sends the spans still batched


if __name__ == "__main__":
    anyio.run(main)
