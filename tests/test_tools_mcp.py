"""The tools served by the real ``mcp`` SDK's low-level ``Server`` and called through its
in-memory ``Client``, on protocol 2026-07-28 (the SDK's default) and 2025-11-25 (the
initialize handshake): ``to_mcp()`` definitions list, ``ToolResult.to_mcp()`` answers
``tools/call``, ``structuredContent`` carries the details (the task id among them) and
the client validates it against each tool's ``outputSchema``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.server import Server, ServerRequestContext
from mcp_types.methods import serialize_server_result

from subagents import SubagentManager
from subagents.testing import echo_agent
from subagents.tools import ToolResult, Toolset, build_tools
from tests.schema_check import closed, details_problems

pytestmark = pytest.mark.anyio

VERSIONS = {"auto": "2026-07-28", "legacy": "2025-11-25"}


def serve(toolset: Toolset) -> Server[Any]:
    """The README's recipe: list ``toolset.to_mcp()``, answer with ``ToolResult.to_mcp()``."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult.model_validate({"tools": toolset.to_mcp()})

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        return (await toolset.call(params.name, params.arguments)).to_mcp()

    return Server("subagents", on_list_tools=list_tools, on_call_tool=call_tool)


@asynccontextmanager
async def connected(mode: str) -> AsyncIterator[tuple[Toolset, Client]]:
    async with SubagentManager([echo_agent()]) as manager:
        toolset = build_tools(manager, "root")
        async with Client(serve(toolset), raise_exceptions=True, mode=mode) as client:
            assert client.protocol_version == VERSIONS[mode]
            yield toolset, client


def check_structured(toolset: Toolset, name: str, result: types.CallToolResult) -> Any:
    """The structured content of ``result``: a JSON object its tool's outputSchema accepts,
    using only the properties the schema lists."""
    content = result.structured_content
    assert isinstance(content, dict)
    tool = toolset[name]
    assert not details_problems(tool, content, complete=True)
    return content


@pytest.mark.parametrize("mode", list(VERSIONS))
async def test_mcp_client_lists_tools_with_output_schemas(mode: str) -> None:
    async with connected(mode) as (toolset, client):
        listed = await client.list_tools()
    assert [t.name for t in listed.tools] == toolset.names
    for tool in listed.tools:
        assert tool.input_schema == toolset[tool.name].input_schema
        assert tool.output_schema == toolset[tool.name].output_schema
        assert tool.output_schema is not None
        assert tool.output_schema["type"] == "object"
        Draft202012Validator.check_schema(tool.output_schema)


@pytest.mark.parametrize("mode", list(VERSIONS))
async def test_mcp_client_spawns_and_waits_by_the_structured_task_id(mode: str) -> None:
    async with connected(mode) as (toolset, client):
        spawned = await client.call_tool("spawn_agent", {"agent": "echo", "input": "hi"})
        assert spawned.is_error is False
        task_id = check_structured(toolset, "spawn_agent", spawned)["task_id"]
        assert toolset.manager.handle(task_id, session_id="root").agent == "echo"

        waited = await client.call_tool("wait_agent", {"task_ids": [task_id], "timeout_ms": 5000})
        assert waited.is_error is False
        details = check_structured(toolset, "wait_agent", waited)
        assert details["completed"] is True
        assert details["task_id"] == task_id
        [envelope] = details["results"]
        assert envelope["task_id"] == task_id
        assert envelope["status"] == "completed"
        assert envelope["output"] == "echo: hi"
        text = waited.content[0]
        assert isinstance(text, types.TextContent)
        assert "echo: hi" in text.text


@pytest.mark.parametrize("mode", list(VERSIONS))
async def test_mcp_client_reads_errors_as_structured_data(mode: str) -> None:
    async with connected(mode) as (toolset, client):
        unknown = await client.call_tool("wait_agent", {"task_ids": "0123456789ab"})
        bad_agent = await client.call_tool("spawn_agent", {"agent": "nope", "input": "x"})
        invalid = await client.call_tool(
            "spawn_agent", {"agent": "echo", "input": "x", "name": "bad name!"}
        )
    assert unknown.is_error is True
    details = check_structured(toolset, "wait_agent", unknown)
    assert details["error"] == "unknown_task"
    assert details["task_id"] == "0123456789ab"
    assert bad_agent.is_error is True
    details = check_structured(toolset, "spawn_agent", bad_agent)
    assert details["error"] == "unknown_agent"
    assert details["known"] == ["echo"]
    assert invalid.is_error is True
    details = check_structured(toolset, "spawn_agent", invalid)
    assert details["error"] == "invalid_arguments"
    assert details["field"] == "name"


@pytest.mark.parametrize("version", sorted(VERSIONS.values()))
def test_tool_result_to_mcp_is_valid_on_both_protocol_versions(version: str) -> None:
    ok = ToolResult(content="spawned", details={"task_id": "0123456789ab"})
    failed = ToolResult(content="no", details={"error": "unknown_task"}, is_error=True)
    for result in (ok, failed):
        wire = serialize_server_result("tools/call", version, result.to_mcp())
        assert wire["content"] == [{"type": "text", "text": result.content}]
        assert wire["structuredContent"] == result.details
        assert wire.get("isError", False) is result.is_error
        if version == "2026-07-28":
            assert wire["resultType"] == "complete"
        else:  # unknown to 2025-11-25: dropped, never an error
            assert "resultType" not in wire


def test_closed_schemas_forbid_unlisted_properties() -> None:
    """The completeness check the tests above rely on does catch an unlisted property."""
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    validator = Draft202012Validator(closed(schema))
    assert validator.is_valid({"a": {}})
    assert not validator.is_valid({"a": {}, "b": 1})
    assert not validator.is_valid({"a": {"c": 1}})
