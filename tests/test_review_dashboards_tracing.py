"""Review of the conversation id on tool spans: the host's own tool calls (the root spans
of a run's traces) belong to the run's conversation as much as its agents do."""

from __future__ import annotations

import pytest
from openinference.semconv.trace import SpanAttributes

from subagents import AgentSpec, Request, Result, RunContext, SubagentManager, Usage
from subagents._manager import telemetry_of
from subagents.tools import build_tools
from tests.otel_support import Otel

pytestmark = pytest.mark.anyio


async def echo(request: Request, ctx: RunContext) -> Result:
    return Result(output="hi", usage=Usage(input_tokens=1, output_tokens=1))


async def test_a_host_tool_call_carries_the_run_conversation_id(otel: Otel) -> None:
    specs = [AgentSpec(name="echo", description="Echoes.", runner=echo)]
    async with otel.install(SubagentManager(specs)) as manager:
        tools = build_tools(manager, "root")
        result = await tools.call("spawn_agent", {"agent": "echo", "input": "x"})
        assert not result.is_error
        await tools.call("wait_agent", {"task_ids": [], "timeout_ms": 0})
        conversation = telemetry_of(manager).conversation_id
    spans = otel.finished()
    tool_spans = [span for span in spans if span.name.startswith("execute_tool ")]
    assert tool_spans
    agent_spans = [span for span in spans if span.name.startswith("invoke_agent ")]
    assert {dict(s.attributes or {})["gen_ai.conversation.id"] for s in agent_spans} == {
        conversation
    }
    for span in tool_spans:
        attrs = dict(span.attributes or {})
        # GenAI: Conditionally Required when available; Phoenix: the session of the span.
        assert attrs.get("gen_ai.conversation.id") == conversation, span.name
        assert attrs.get(SpanAttributes.SESSION_ID) == conversation, span.name
