"""Every span, event, link and metric name the library emits, checked against the
``opentelemetry-semantic-conventions`` package and the ``openinference-semantic-conventions``
one: a name is either a constant of one of them or in the ``subagents.`` namespace; the
Required GenAI attributes are always there.

The SDK providers here are private to each test (the manager's telemetry is replaced; the
tools trace with their manager's), so nothing depends on the global providers.
"""

from __future__ import annotations

import importlib
import json
import pkgutil

import anyio
import pytest
from openinference.semconv.trace import SpanAttributes, ToolAttributes
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

from subagents import (
    AgentSpec,
    Request,
    Result,
    RunContext,
    SubagentConfig,
    SubagentManager,
    Usage,
    _semconv,
)
from subagents._semconv import MESSAGE_CONTENT_LIMIT, TOOL_CONTENT_LIMIT
from subagents.tools import build_tools
from tests.helpers import clock_backends
from tests.otel_support import Otel

pytestmark = pytest.mark.anyio

DEPRECATED = {
    "gen_ai.system",
    "gen_ai.prompt",
    "gen_ai.completion",
    "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens",
}


def _constants(*packages: str) -> set[str]:
    names: set[str] = set()
    for package in packages:
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            module = importlib.import_module(f"{package}.{info.name}")
            names |= {
                value
                for key, value in vars(module).items()
                if key.isupper() and isinstance(value, str)
            }
    return names


SEMCONV_ATTRIBUTES = _constants(
    "opentelemetry.semconv.attributes", "opentelemetry.semconv._incubating.attributes"
)
SEMCONV_METRICS = _constants(
    "opentelemetry.semconv.metrics", "opentelemetry.semconv._incubating.metrics"
)
OPENINFERENCE_ATTRIBUTES = {
    value
    for cls in (SpanAttributes, ToolAttributes)
    for key, value in vars(cls).items()
    if key.isupper() and isinstance(value, str)
}


async def echo(request: Request, ctx: RunContext) -> Result:
    return Result(output=f"echo {request.input}", usage=Usage(input_tokens=3, output_tokens=5))


async def broken(request: Request, ctx: RunContext) -> str:
    raise ValueError("disk on fire")


async def stuck(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError


async def orchestrator(request: Request, ctx: RunContext) -> str:
    # Tools called inside a child: spans nest under it and carry the conversation id.
    tools = build_tools(ctx.manager, ctx.session_id)
    spawned = await tools.call("spawn_agent", {"agent": "general", "input": "inner"})
    await tools.call("wait_agent", {"task_ids": [spawned.details["task_id"]]})
    await tools.call("wait_agent", {"task_ids": ["not-a-task"]})
    return "orchestrated"


SPECS = [
    AgentSpec(name="general", description="Echoes.", runner=echo),
    AgentSpec(name="acme", description="Echoes.", runner=echo, model="m-1", provider="anthropic"),
    AgentSpec(name="broken", description="Fails.", runner=broken),
    AgentSpec(name="stuck", description="Never ends.", runner=stuck),
    AgentSpec(name="orchestrator", description="Uses tools.", runner=orchestrator),
]


async def _exercise(manager: SubagentManager) -> None:
    """Spawn, execute, every tool, every error kind, a timeout and a cancellation."""
    await manager.spawn("general", "a").wait()
    await manager.spawn("acme", "b").wait()
    await manager.execute("broken", "c")
    await manager.spawn("stuck", "d", timeout=0.02).wait()
    cancelled = manager.spawn("stuck", "e")
    cancelled.cancel()
    await cancelled.wait()
    await manager.execute("orchestrator", "f")
    for mode in ("envelope", "string"):
        tools = build_tools(manager, "root", return_mode=mode)
        spawned = await tools.call(
            "spawn_agent", {"agent": "general", "input": "g"}, call_id="call-1"
        )
        task_id = spawned.details["task_id"]
        await tools.call("wait_agent", {"task_ids": [task_id]}, call_id="call-2")
        await tools.call("delegate_to_agent", {"agent": "acme", "input": "h"})
        await tools.call("delegate_to_agent", {"agent": "broken", "input": "i"})
        await tools.call("cancel_agent", {"task_id": task_id})
        await tools.call("list_agents", {})
        await tools.call("spawn_agent", {"agent": "nobody", "input": "j"})
        await tools.call("spawn_agent", {"agent": "general"})
        await tools.call("spawn_agent", "{not json")
        await tools.call("wait_agent", {"task_ids": ["nope", "nada"]})
        await tools.call("cancel_agent", {"task_id": "nope"})
        await tools.call("no_such_tool", {"x": 1})


def _emitted(otel: Otel) -> tuple[set[str], set[str], set[str]]:
    """(span/event/link attribute names, metric names, metric attribute names)."""
    attributes: set[str] = set()
    for span in otel.finished():
        attributes |= set(span.attributes or {})
        for event in span.events:
            attributes |= set(event.attributes or {})
        for link in span.links:
            attributes |= set(link.attributes or {})
    metrics = otel.metrics()
    metric_attributes = {key for points in metrics.values() for p in points for key in p.attributes}
    return attributes, set(metrics), metric_attributes


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_every_emitted_name_is_semconv_or_ours(otel: Otel) -> None:
    config = SubagentConfig(capture_content=True, usage_spans=True)
    async with otel.install(SubagentManager(SPECS, config=config)) as manager:
        await _exercise(manager)
    attributes, metric_names, metric_attributes = _emitted(otel)

    foreign = {
        name
        for name in attributes | metric_attributes
        if name not in SEMCONV_ATTRIBUTES | OPENINFERENCE_ATTRIBUTES
        and not name.startswith("subagents.")
    }
    assert foreign == set(), "neither a semconv attribute nor in the subagents. namespace"
    # The OpenInference keys are on spans only (metric points stay GenAI's).
    assert not metric_attributes & (OPENINFERENCE_ATTRIBUTES - SEMCONV_ATTRIBUTES)
    assert not (attributes | metric_attributes) & DEPRECATED
    assert {m for m in metric_names if m not in SEMCONV_METRICS} == {
        m for m in metric_names if m.startswith("subagents.")
    }
    # What the conventions define and the library knows, it writes.
    for name in (
        gen_ai_attributes.GEN_AI_PROVIDER_NAME,
        gen_ai_attributes.GEN_AI_TOOL_DESCRIPTION,
        gen_ai_attributes.GEN_AI_TOOL_CALL_ARGUMENTS,
        gen_ai_attributes.GEN_AI_TOOL_CALL_RESULT,
        gen_ai_attributes.GEN_AI_TOOL_CALL_ID,
        gen_ai_attributes.GEN_AI_CONVERSATION_ID,
        gen_ai_attributes.GEN_AI_INPUT_MESSAGES,
        gen_ai_attributes.GEN_AI_OUTPUT_MESSAGES,
        "error.type",
    ):
        assert name in attributes
    assert gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION in metric_names
    assert gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE in metric_names


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_required_genai_attributes_are_always_set(otel: Otel) -> None:
    async with otel.install(SubagentManager(SPECS)) as manager:
        await _exercise(manager)
    spans = otel.finished()
    invocations = [s for s in spans if s.name.startswith("invoke_agent ")]
    tool_calls = [s for s in spans if s.name.startswith("execute_tool ")]
    assert len(invocations) >= 10
    assert len(tool_calls) >= 24
    for span in invocations:
        attrs = dict(span.attributes or {})
        assert attrs["gen_ai.operation.name"] == "invoke_agent"
        expected = "anthropic" if attrs["gen_ai.agent.name"] == "acme" else "subagents"
        assert attrs["gen_ai.provider.name"] == expected
    for span in tool_calls:
        attrs = dict(span.attributes or {})
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert attrs["gen_ai.tool.name"] == span.name.removeprefix("execute_tool ")
    points = otel.metrics()
    for name in ("gen_ai.client.operation.duration", "gen_ai.client.token.usage"):
        assert points[name]
        for point in points[name]:
            assert point.attributes["gen_ai.operation.name"] == "invoke_agent"
            assert point.attributes["gen_ai.provider.name"] in ("subagents", "anthropic")
    acme = [
        p
        for p in points["gen_ai.client.operation.duration"]
        if p.attributes["gen_ai.agent.name"] == "acme"
    ]
    assert acme
    assert {p.attributes["gen_ai.request.model"] for p in acme} == {"m-1"}
    tokens = {
        (p.attributes["gen_ai.agent.name"], p.attributes["gen_ai.token.type"]): p
        for p in points["gen_ai.client.token.usage"]
    }
    assert tokens["general", "input"].sum == 3 * tokens["general", "input"].count
    assert tokens["general", "output"].sum == 5 * tokens["general", "output"].count
    assert ("broken", "input") not in tokens  # no usage reported, nothing recorded


async def test_tool_spans_record_their_description(otel: Otel) -> None:
    async with otel.install(SubagentManager(SPECS)) as manager:
        tools = build_tools(manager, "root")
        await tools.call("list_agents", {})
        await tools.call("spawn_agent", {"agent": "nobody", "input": "x"})
    by_name = {s.name: dict(s.attributes or {}) for s in otel.finished()}
    for tool in ("list_agents", "spawn_agent"):
        attrs = by_name[f"execute_tool {tool}"]
        assert attrs["gen_ai.tool.description"] == tools[tool].description
        # Content is opt-in.
        assert "gen_ai.tool.call.arguments" not in attrs
        assert "gen_ai.tool.call.result" not in attrs


async def test_capture_content_records_tool_arguments_and_results(otel: Otel) -> None:
    config = SubagentConfig(capture_content=True)
    huge = "z" * (3 * TOOL_CONTENT_LIMIT)
    async with otel.install(SubagentManager(SPECS, config=config)) as manager:
        tools = build_tools(manager, "root")
        delegated = await tools.call("delegate_to_agent", {"agent": "general", "input": "hi"})
        await tools.call("delegate_to_agent", {"agent": "general", "input": huge})
        refused = await tools.call("spawn_agent", '{"agent": "nobody", "input": "x"}')
        await tools.call("no_such_tool", '{"a": 1}')
    calls = [dict(s.attributes or {}) for s in otel.finished() if s.name.startswith("execute")]
    small, big, error, unknown = calls
    assert small["gen_ai.tool.call.arguments"] == '{"agent":"general","input":"hi"}'
    assert small["gen_ai.tool.call.result"] == delegated.content
    for value in (big["gen_ai.tool.call.arguments"], big["gen_ai.tool.call.result"]):
        assert isinstance(value, str)
        assert len(value) <= TOOL_CONTENT_LIMIT
    assert str(big["gen_ai.tool.call.arguments"]).endswith("…")
    # A failed call records what it was given; its answer is the status description.
    assert error["gen_ai.tool.call.arguments"] == '{"agent":"nobody","input":"x"}'
    assert "gen_ai.tool.call.result" not in error
    assert refused.is_error
    assert unknown["gen_ai.tool.call.arguments"] == '{"a": 1}'


MESSAGES = ("gen_ai.system_instructions", "gen_ai.input.messages", "gen_ai.output.messages")


def _content(attribute: str, value: object) -> str:
    """The text inside a captured message attribute, which must be valid JSON."""
    assert isinstance(value, str)
    parsed = json.loads(value)
    if attribute == "gen_ai.system_instructions":
        return str(parsed[0]["content"])
    return str(parsed[0]["parts"][0]["content"])


async def test_captured_messages_are_bounded_and_stay_valid_json(otel: Otel) -> None:
    # Quotes and control characters grow when escaped: the bound is on the JSON text.
    huge = ('"\x01' + "y" * 50) * 2_000

    async def loud(request: Request, ctx: RunContext) -> str:
        return request.input + request.input

    config = SubagentConfig(capture_content=True)
    spec = AgentSpec(name="loud", description="Repeats.", runner=loud, prompt=huge)
    async with otel.install(SubagentManager([spec], config=config)) as manager:
        await manager.spawn("loud", huge).wait()
    (span,) = otel.finished()
    attrs = dict(span.attributes or {})
    for attribute in MESSAGES:
        value = attrs[attribute]
        assert isinstance(value, str)
        assert len(value) <= MESSAGE_CONTENT_LIMIT, attribute
        text = _content(attribute, value)
        assert text.endswith("…")
        assert huge.startswith(text[:-1])


@pytest.mark.parametrize(
    "text",
    ["", "short", "y" * MESSAGE_CONTENT_LIMIT, "\x00" * MESSAGE_CONTENT_LIMIT, '"é\n' * 3000],
)
def test_a_message_attribute_keeps_as_much_text_as_fits(text: str) -> None:
    attrs = _semconv.input_attributes(text, text)
    for attribute in ("gen_ai.system_instructions", "gen_ai.input.messages"):
        if not text and attribute == "gen_ai.system_instructions":
            assert attribute not in attrs  # no prompt, no instructions
            continue
        value = attrs[attribute]
        assert isinstance(value, str)
        assert len(value) <= MESSAGE_CONTENT_LIMIT
        kept = _content(attribute, value)
        if kept == text:
            continue
        assert kept.endswith("…")
        assert text.startswith(kept[:-1])
        # One more character would not have fitted: that text is cut in its turn.
        longer = text[: len(kept)] + "…"
        attribute = _semconv.input_attributes(None, longer)["gen_ai.input.messages"]
        assert _content("gen_ai.input.messages", attribute) != longer


async def test_a_prompt_that_is_not_valid_unicode_is_still_traced(otel: Otel) -> None:
    async def quiet(request: Request, ctx: RunContext) -> str:
        return "ok"

    config = SubagentConfig(capture_content=True)
    spec = AgentSpec(name="quiet", description="Quiet.", runner=quiet, prompt="p \udc80")
    async with otel.install(SubagentManager([spec], config=config)) as manager:
        await manager.spawn("quiet", "a lone surrogate: \udc80").wait()
    (span,) = otel.finished()
    attrs = dict(span.attributes or {})
    assert _content("gen_ai.input.messages", attrs["gen_ai.input.messages"]).startswith("a lone")
    assert _content("gen_ai.system_instructions", attrs["gen_ai.system_instructions"])
