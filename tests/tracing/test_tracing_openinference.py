"""What LLM tracing UIs read: the OpenInference keys beside the GenAI ones, the
``finish_reason`` of output messages, a conversation id per run, and the opt-in usage spans.

The names are checked against ``openinference-semantic-conventions`` (a test dependency
only: the library writes them as plain strings). SDK providers are private to each test.
"""

from __future__ import annotations

import json
import re

import anyio
import pytest
from jsonschema import Draft202012Validator
from openinference.semconv.trace import (
    OpenInferenceMimeTypeValues,
    OpenInferenceSpanKindValues,
    SpanAttributes,
)
from opentelemetry.sdk.trace import ReadableSpan

from subagents import (
    AgentSpec,
    ConfigError,
    Request,
    Result,
    RunContext,
    SpawnOptions,
    SubagentConfig,
    SubagentManager,
    Usage,
    _semconv,
)
from subagents._manager import DEFAULT_SESSION, telemetry_of
from subagents.tools import build_tools
from tests.otel_support import Otel

pytestmark = pytest.mark.anyio

KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
KINDS = {kind.value for kind in OpenInferenceSpanKindValues}
MIME_TYPES = {mime.value for mime in OpenInferenceMimeTypeValues}
TEXT = OpenInferenceMimeTypeValues.TEXT.value
JSON = OpenInferenceMimeTypeValues.JSON.value

# The GenAI output-messages schema, as far as these spans use it: every message has a role,
# parts and the Required finish_reason; text parts have their content.
OUTPUT_MESSAGES = Draft202012Validator(
    {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["role", "parts", "finish_reason"],
            "properties": {
                "role": {"type": "string"},
                "finish_reason": {"type": "string"},
                "parts": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "content"],
                        "properties": {"type": {"const": "text"}, "content": {"type": "string"}},
                    },
                },
            },
        },
    }
)


async def echo(request: Request, ctx: RunContext) -> Result:
    return Result(output=f"echo {request.input}", usage=Usage(input_tokens=3, output_tokens=5))


async def broken(request: Request, ctx: RunContext) -> str:
    raise ValueError("disk on fire")


async def slow(request: Request, ctx: RunContext) -> str:
    ctx.report(output="half an answer", iterations=2)
    await anyio.sleep_forever()
    raise AssertionError


async def parent(request: Request, ctx: RunContext) -> Result:
    await ctx.spawn("echo", "inner").wait()
    tools = build_tools(ctx.manager, ctx.session_id)
    await tools.call("list_agents", {})
    return Result(output="parent done", usage=Usage(input_tokens=100, output_tokens=10))


SPECS = [
    AgentSpec(name="echo", description="Echoes.", runner=echo, model="m-1", provider="openai"),
    AgentSpec(name="broken", description="Fails.", runner=broken),
    AgentSpec(name="slow", description="Overruns.", runner=slow),
    AgentSpec(name="parent", description="Delegates.", runner=parent),
]


def attributes_of(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def by_agent(otel: Otel) -> dict[str, dict[str, object]]:
    """The attributes of each ``invoke_agent`` span, by agent path."""
    found = {}
    for span in otel.finished():
        if span.name.startswith("invoke_agent "):
            attrs = attributes_of(span)
            found[str(attrs["subagents.agent_path"])] = attrs
    return found


async def test_agent_spans_carry_the_span_kind_session_and_metadata(otel: Otel) -> None:
    async with otel.install(SubagentManager(SPECS)) as manager:
        echoed = await manager.spawn("echo", "secret input").wait()
        await manager.spawn("echo", "again").wait()
        await manager.spawn("slow", "x", timeout=0.05).wait()
    spans = by_agent(otel)
    first, second, slow_span = spans["/root/echo"], spans["/root/echo-2"], spans["/root/slow"]
    assert first[KIND] == second[KIND] == "AGENT"
    assert first[SpanAttributes.SESSION_ID] == first["gen_ai.conversation.id"]
    # The metadata tells repeated agents apart: their paths, ids, status and queue wait.
    assert json.loads(str(first[SpanAttributes.METADATA])) == {
        "agent_path": "/root/echo",
        "parent_path": "/root",
        "task_id": echoed.task_id,
        "status": "completed",
        "queue_ms": echoed.queue_ms,
        "attempts": 1,
        "iterations": 0,
    }
    assert json.loads(str(second[SpanAttributes.METADATA]))["agent_path"] == "/root/echo-2"
    timed_out = json.loads(str(slow_span[SpanAttributes.METADATA]))
    assert (timed_out["status"], timed_out["iterations"]) == ("timeout", 2)
    # Content stays out unless asked for: no input or output value, no text in metadata.
    for attrs in spans.values():
        assert SpanAttributes.INPUT_VALUE not in attrs
        assert SpanAttributes.OUTPUT_VALUE not in attrs
        assert not any("secret input" in str(value) for value in attrs.values())
        assert not any("half an answer" in str(value) for value in attrs.values())


async def test_capture_content_records_input_and_output_values(otel: Otel) -> None:
    config = SubagentConfig(capture_content=True)
    async with otel.install(SubagentManager(SPECS, config=config)) as manager:
        await manager.spawn("echo", "what is 2+2").wait()
        failed = await manager.spawn("broken", "x").wait()
        timed_out = await manager.spawn("slow", "y", timeout=0.05).wait()
    spans = by_agent(otel)
    echo_span = spans["/root/echo"]
    assert echo_span[SpanAttributes.INPUT_VALUE] == "what is 2+2"
    assert echo_span[SpanAttributes.INPUT_MIME_TYPE] == TEXT
    assert echo_span[SpanAttributes.OUTPUT_VALUE] == "echo what is 2+2"
    assert echo_span[SpanAttributes.OUTPUT_MIME_TYPE] == TEXT
    # A failed child's output is its error text (a timed-out one's partial output stays
    # in gen_ai.output.messages).
    assert spans["/root/broken"][SpanAttributes.OUTPUT_VALUE] == failed.error
    assert spans["/root/slow"][SpanAttributes.OUTPUT_VALUE] == timed_out.error
    assert timed_out.error.startswith("watchdog")


async def test_every_output_message_has_a_finish_reason(otel: Otel) -> None:
    # Without finish_reason (Required by the GenAI schema) a UI drops the whole output.
    config = SubagentConfig(capture_content=True)
    async with otel.install(SubagentManager(SPECS, config=config)) as manager:
        await manager.spawn("echo", "a").wait()
        await manager.spawn("slow", "b", timeout=0.05).wait()
    spans = by_agent(otel)
    reasons = {}
    for path, attrs in spans.items():
        messages = json.loads(str(attrs["gen_ai.output.messages"]))
        errors = [error.message for error in OUTPUT_MESSAGES.iter_errors(messages)]
        assert errors == [], (path, errors)
        reasons[path] = [message["finish_reason"] for message in messages]
    assert reasons == {"/root/echo": ["stop"], "/root/slow": ["error"]}


async def test_tool_spans_carry_the_tool_panel_and_content_under_capture(otel: Otel) -> None:
    config = SubagentConfig(capture_content=True)
    async with otel.install(SubagentManager(SPECS, config=config)) as manager:
        tools = build_tools(manager, "root")
        listed = await tools.call("list_agents", {})
        refused = await tools.call("spawn_agent", "{not json")
    spans = [attributes_of(s) for s in otel.finished() if s.name.startswith("execute_tool ")]
    ok, bad = spans
    for attrs, tool in ((ok, tools["list_agents"]), (bad, tools["spawn_agent"])):
        assert attrs[KIND] == "TOOL"
        assert attrs[SpanAttributes.TOOL_NAME] == tool.name
        assert attrs[SpanAttributes.TOOL_DESCRIPTION] == tool.description
        assert json.loads(str(attrs[SpanAttributes.TOOL_PARAMETERS])) == tool.input_schema
    assert (ok[SpanAttributes.INPUT_VALUE], ok[SpanAttributes.INPUT_MIME_TYPE]) == ("{}", JSON)
    assert ok[SpanAttributes.OUTPUT_VALUE] == ok["gen_ai.tool.call.result"] == listed.content
    # Arguments that are not JSON are text; a failed call's output is what the model read.
    assert (bad[SpanAttributes.INPUT_VALUE], bad[SpanAttributes.INPUT_MIME_TYPE]) == (
        "{not json",
        TEXT,
    )
    assert bad[SpanAttributes.OUTPUT_VALUE] == refused.content
    assert "gen_ai.tool.call.result" not in bad


async def test_tool_spans_without_capture_have_no_content(otel: Otel) -> None:
    async with otel.install(SubagentManager(SPECS)) as manager:
        await build_tools(manager, "root").call("list_agents", {})
    (span,) = otel.finished()
    attrs = attributes_of(span)
    assert attrs[KIND] == "TOOL"
    assert SpanAttributes.TOOL_PARAMETERS in attrs  # the schema is no content
    assert SpanAttributes.INPUT_VALUE not in attrs
    assert SpanAttributes.OUTPUT_VALUE not in attrs


async def test_every_span_has_a_valid_kind_and_mime_types(otel: Otel) -> None:
    config = SubagentConfig(capture_content=True, usage_spans=True)
    async with otel.install(SubagentManager(SPECS, config=config)) as manager:
        await manager.spawn("parent", "p").wait()
        await manager.spawn("broken", "b").wait()
        tools = build_tools(manager, "root")
        await tools.call("delegate_to_agent", {"agent": "echo", "input": "d"})
        await tools.call("no_such_tool", {})
    spans = otel.finished()
    assert len(spans) >= 8
    for span in spans:
        attrs = attributes_of(span)
        assert attrs[KIND] in KINDS, span.name
        for key in (SpanAttributes.INPUT_MIME_TYPE, SpanAttributes.OUTPUT_MIME_TYPE):
            assert attrs.get(key, TEXT) in MIME_TYPES, (span.name, key)
        if SpanAttributes.SESSION_ID in attrs:
            assert attrs[SpanAttributes.SESSION_ID] == attrs["gen_ai.conversation.id"]


# ------------------------------------------------------------------ conversation id


def conversations(otel: Otel) -> set[object]:
    return {attributes_of(s).get("gen_ai.conversation.id") for s in otel.finished()}


async def test_two_managers_never_share_a_conversation_id() -> None:
    first, second = Otel(), Otel()
    try:
        for otel in (first, second):
            async with otel.install(SubagentManager(SPECS)) as manager:
                await manager.spawn("parent", "p").wait()  # a child, a grandchild, a tool
                await manager.execute("echo", "e")
                own = telemetry_of(manager).conversation_id
            assert re.fullmatch("[0-9a-f]{32}", own)
            # One run's spans all share it: children, grandchildren, tools inside them.
            assert conversations(otel) == {own}
        assert conversations(first).isdisjoint(conversations(second))
    finally:
        first.shutdown()
        second.shutdown()


async def test_concurrent_managers_of_one_program_have_their_own_conversations() -> None:
    otel = Otel()
    try:
        managers = [otel.install(SubagentManager(SPECS)) for _ in range(2)]
        async with managers[0] as one, managers[1] as two:
            await one.spawn("echo", "a").wait()
            await two.spawn("echo", "b").wait()
            ids = {telemetry_of(m).conversation_id for m in (one, two)}
        assert len(ids) == 2
        assert conversations(otel) == ids
    finally:
        otel.shutdown()


async def test_a_conversation_id_given_in_the_config_or_by_session(otel: Otel) -> None:
    config = SubagentConfig(conversation_id="chat-42")
    async with otel.install(SubagentManager(SPECS, config=config)) as manager:
        await manager.spawn("parent", "p").wait()
        await manager.spawn("echo", "named", session_id="thread-7").wait()
    spans = by_agent(otel)
    for path in ("/root/parent", "/root/parent/echo"):
        assert spans[path]["gen_ai.conversation.id"] == "chat-42"
        assert spans[path][SpanAttributes.SESSION_ID] == "chat-42"
    # A session the caller named is its own conversation.
    named = [a for a in spans.values() if a["subagents.session_id"] == "thread-7"]
    assert [a["gen_ai.conversation.id"] for a in named] == ["thread-7"]


def test_the_default_session_is_the_managers() -> None:
    assert _semconv.DEFAULT_SESSION == DEFAULT_SESSION


@pytest.mark.parametrize("bad", ["", 42, "x" * 257, "lone \udc80 surrogate", b"bytes"])
def test_a_bad_conversation_id_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ConfigError, match="conversation_id"):
        SubagentConfig(conversation_id=bad)  # type: ignore[arg-type]


async def test_a_host_tool_call_carries_the_run_conversation_id(otel: Otel) -> None:
    """The host's own tool calls (the root spans of a run's traces) belong to the run's
    conversation as much as its agents do."""
    async with otel.install(SubagentManager(SPECS)) as manager:
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


# ------------------------------------------------------------------ usage spans


def usage_spans(otel: Otel) -> dict[str, ReadableSpan]:
    return {
        str(attributes_of(s)["subagents.agent_path"]): s
        for s in otel.finished()
        if s.name.startswith("usage ")
    }


async def test_no_usage_spans_by_default(otel: Otel) -> None:
    async with otel.install(SubagentManager(SPECS)) as manager:
        await manager.spawn("parent", "p").wait()
    assert usage_spans(otel) == {}


async def test_usage_spans_hold_each_agents_own_tokens_under_its_span(otel: Otel) -> None:
    config = SubagentConfig(usage_spans=True)
    async with otel.install(SubagentManager(SPECS, config=config)) as manager:
        await manager.spawn("parent", "p").wait()
        await manager.spawn("echo", "o", options=SpawnOptions(model="m-2")).wait()
        await manager.spawn("broken", "b").wait()  # reported no tokens: no usage span
    invocations = {
        str(attributes_of(s)["subagents.agent_path"]): s
        for s in otel.finished()
        if s.name.startswith("invoke_agent ")
    }
    found = usage_spans(otel)
    assert set(found) == {"/root/parent", "/root/parent/echo", "/root/echo"}
    expected = {
        # path: (name, prompt, completion, model, provider)
        "/root/parent": ("usage parent", 100, 10, "unknown", None),
        "/root/parent/echo": ("usage echo", 3, 5, "m-1", "openai"),
        "/root/echo": ("usage echo", 3, 5, "m-2", "openai"),
    }
    for path, (name, prompt, completion, model, provider) in expected.items():
        span, invocation = found[path], invocations[path]
        attrs = attributes_of(span)
        assert span.name == name
        assert attrs[KIND] == "LLM"
        # Each agent's own tokens, never its children's: the parent's are its 100 / 10.
        assert attrs[SpanAttributes.LLM_TOKEN_COUNT_PROMPT] == prompt
        assert attrs[SpanAttributes.LLM_TOKEN_COUNT_COMPLETION] == completion
        assert attrs[SpanAttributes.LLM_TOKEN_COUNT_TOTAL] == prompt + completion
        assert attrs[SpanAttributes.LLM_MODEL_NAME] == model
        # A spec without a provider names none: "subagents" is no OpenInference provider.
        assert attrs.get(SpanAttributes.LLM_PROVIDER) == provider
        assert attrs[SpanAttributes.SESSION_ID] == telemetry_of(manager).conversation_id
        # A GenAI backend reads the tokens on invoke_agent alone: never twice.
        assert not any(key.startswith("gen_ai.usage.") for key in attrs)
        assert attributes_of(invocation)["gen_ai.usage.input_tokens"] == prompt
        assert span.parent is not None
        assert invocation.context is not None
        assert span.parent.span_id == invocation.context.span_id
        assert span.context is not None
        assert span.context.trace_id == invocation.context.trace_id
        assert span.start_time is not None
        assert span.end_time is not None
        assert invocation.start_time is not None
        assert invocation.end_time is not None
        assert invocation.start_time <= span.start_time <= span.end_time <= invocation.end_time
