"""Exported tool definitions match the providers' documented shapes field by field, and
every schema is valid JSON Schema (draft 2020-12)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import anyio
import jsonschema
import pytest
from jsonschema import Draft202012Validator

from subagents import SubagentManager
from subagents._json import dumps, loads
from subagents.testing import echo_agent
from subagents.tools import ToolResult, Toolset, build_tools

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI and Anthropic tool-name rule
MCP_HINTS = {"title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}


@pytest.fixture
async def tools(anyio_backend: str) -> AsyncIterator[Toolset]:
    async with SubagentManager([echo_agent()]) as manager:
        yield build_tools(manager, "root")


def check_schema(schema: object) -> dict[str, object]:
    assert isinstance(schema, dict)
    Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) <= set(schema["properties"])
    loads(dumps(schema))  # plain JSON
    return schema


@pytest.mark.anyio
async def test_input_schemas_are_draft_2020_12(tools: Toolset) -> None:
    for tool in tools:
        schema = check_schema(tool.input_schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        for prop in schema["properties"].values():  # type: ignore[attr-defined]
            assert prop["description"]
    by_name = {t.name: t.input_schema for t in tools}
    assert set(by_name["spawn_agent"]["required"]) == {"agent", "input"}
    assert set(by_name["spawn_agent"]["properties"]) == {
        "agent",
        "input",
        "name",
        "timeout_ms",
        "budget",
        "idempotency_key",
    }
    assert set(by_name["wait_agent"]["required"]) == {"task_ids"}
    assert set(by_name["wait_agent"]["properties"]) == {"task_ids", "mode", "timeout_ms"}
    assert set(by_name["delegate_to_agent"]["required"]) == {"agent", "input"}
    assert set(by_name["cancel_agent"]["required"]) == {"task_id"}
    assert by_name["list_agents"].get("properties", {}) == {}


@pytest.mark.anyio
async def test_openai_chat_completions_shape(tools: Toolset) -> None:
    exported = tools.to_openai_chat()
    assert len(exported) == 5
    for entry, tool in zip(exported, tools, strict=True):
        assert isinstance(entry, dict)
        assert set(entry) == {"type", "function"}
        assert entry["type"] == "function"
        function = entry["function"]
        assert set(function) == {"name", "description", "parameters", "strict"}
        assert NAME.match(function["name"])
        assert function["name"] == tool.name
        assert function["description"] == tool.description
        assert function["strict"] is False
        assert check_schema(function["parameters"]) == tool.input_schema


@pytest.mark.anyio
async def test_openai_responses_shape(tools: Toolset) -> None:
    for entry, tool in zip(tools.to_openai_responses(), tools, strict=True):
        assert isinstance(entry, dict)
        assert set(entry) == {"type", "name", "description", "parameters", "strict"}
        assert entry["type"] == "function"
        assert entry["name"] == tool.name
        assert entry["description"] == tool.description
        assert entry["strict"] is False
        assert check_schema(entry["parameters"]) == tool.input_schema


@pytest.mark.anyio
async def test_openai_strict_mode(tools: Toolset) -> None:
    for entry in [*tools.to_openai_responses(strict=True), *tools.to_openai_chat(strict=True)]:
        assert isinstance(entry, dict)
        params = entry.get("parameters") or entry["function"]["parameters"]
        strict = entry.get("strict", entry.get("function", {}).get("strict"))
        assert strict is True
        schema = check_schema(params)
        assert "$schema" not in schema
        text = dumps(schema).decode()
        for keyword in ("minLength", "maxLength", "default", "allOf", "oneOf"):
            assert f'"{keyword}"' not in text
        assert schema["required"] == list(schema["properties"])  # type: ignore[call-overload]
    wait = tools["wait_agent"].to_openai_responses(strict=True)["parameters"]
    validator = Draft202012Validator(wait)
    validator.validate({"task_ids": "abc", "mode": None, "timeout_ms": None})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"task_ids": "abc"})  # strict: every field present


@pytest.mark.anyio
async def test_strict_nulls_are_accepted_by_the_tools(tools: Toolset) -> None:
    spawned = await tools.call(
        "spawn_agent", {"agent": "echo", "input": "x", "name": None, "timeout_ms": None}
    )
    waited = await tools.call(
        "wait_agent", {"task_ids": spawned.details["task_id"], "mode": None, "timeout_ms": None}
    )
    assert waited.details["completed"] is True


@pytest.mark.anyio
async def test_anthropic_shape(tools: Toolset) -> None:
    for entry, tool in zip(tools.to_anthropic(), tools, strict=True):
        assert isinstance(entry, dict)
        assert set(entry) == {"name", "description", "input_schema"}
        assert NAME.match(entry["name"])
        assert entry["description"] == tool.description
        assert check_schema(entry["input_schema"]) == tool.input_schema


@pytest.mark.anyio
async def test_mcp_shape(tools: Toolset) -> None:
    for entry, tool in zip(tools.to_mcp(), tools, strict=True):
        assert isinstance(entry, dict)
        assert set(entry) == {
            "name",
            "title",
            "description",
            "inputSchema",
            "outputSchema",
            "annotations",
        }
        assert entry["name"] == tool.name
        assert isinstance(entry["title"], str)
        assert check_schema(entry["inputSchema"]) == tool.input_schema
        assert entry["outputSchema"] == tool.output_schema
        Draft202012Validator.check_schema(entry["outputSchema"])
        assert entry["outputSchema"]["type"] == "object"  # 2025-11-25 requires an object root
        annotations = entry["annotations"]
        assert set(annotations) <= MCP_HINTS
        assert all(isinstance(v, bool) for k, v in annotations.items() if k != "title")
    hints = {e["name"]: e["annotations"] for e in tools.to_mcp()}  # type: ignore[index]
    assert hints["list_agents"]["readOnlyHint"] is True
    assert hints["cancel_agent"]["idempotentHint"] is True
    assert hints["cancel_agent"]["destructiveHint"] is True
    assert hints["wait_agent"]["readOnlyHint"] is False  # it consumes results


@pytest.mark.anyio
async def test_schemas_accept_what_the_tools_accept(tools: Toolset) -> None:
    valid = {
        "spawn_agent": {"agent": "echo", "input": "x", "name": "n", "timeout_ms": 5},
        "wait_agent": {"task_ids": ["a", "b"], "mode": "any", "timeout_ms": 0},
        "delegate_to_agent": {"agent": "echo", "input": "x"},
        "cancel_agent": {"task_id": "a"},
        "list_agents": {},
    }
    invalid = {
        "spawn_agent": {"agent": "echo"},
        "wait_agent": {"task_ids": "a", "timeout_ms": -5},
        "delegate_to_agent": {"agent": "echo", "input": "x", "extra": 1},
        "cancel_agent": {"task_id": 3},
        "list_agents": {"x": 1},
    }
    for tool in tools:
        validator = Draft202012Validator(tool.input_schema)
        validator.validate(valid[tool.name])
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(invalid[tool.name])
        result = await tools.call(tool.name, invalid[tool.name])
        assert result.is_error
        assert result.details["error"] == "invalid_arguments"


def test_tool_result_message_shapes() -> None:
    result = ToolResult(content="hi", details={"a": 1}, is_error=True)
    assert result.to_openai_chat("call_1") == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "hi",
    }
    assert result.to_openai_responses("call_1") == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "hi",
    }
    assert result.to_anthropic("toolu_1") == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "hi",
        "is_error": True,
    }
    assert result.to_mcp() == {
        "content": [{"type": "text", "text": "hi"}],
        "structuredContent": {"a": 1},
        "isError": True,
        "resultType": "complete",
    }
    assert result.to_dict() == {"content": "hi", "details": {"a": 1}, "is_error": True}


def test_export_is_a_copy() -> None:
    async def main() -> None:
        async with SubagentManager([echo_agent()]) as manager:
            tools = build_tools(manager, "root")
            exported = tools.to_anthropic()[0]
            assert isinstance(exported, dict)
            exported["input_schema"]["properties"].clear()  # type: ignore[index,union-attr]
            assert tools["spawn_agent"].input_schema["properties"]

    anyio.run(main)
