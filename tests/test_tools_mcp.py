"""The tools served by the real ``mcp`` SDK's low-level ``Server`` and called through its
in-memory ``Client``, on protocol 2026-07-28 (the SDK's default) and 2025-11-25 (the
initialize handshake): ``to_mcp()`` definitions list, ``ToolResult.to_mcp()`` answers
``tools/call``, ``structuredContent`` carries the details (the task id among them) and
the client validates it against each tool's ``outputSchema``."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.server import Server, ServerRequestContext
from mcp_types.methods import serialize_server_result

from subagents import AgentSpec, Request, Result, RunContext, SubagentManager
from subagents._json import JSONValue, dumps_str
from subagents.testing import echo_agent
from subagents.tools import ToolResult, Toolset, build_tools
from subagents.tools._structured import KEEP, bounded_details
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


LOUD_OUTPUT = ('"\\' + "z" * 98) * 1_000  # 100 000 characters, quotes and backslashes
LOUD_FILES = tuple(f"src/{'d' * 100}/{i}.py" for i in range(500))


async def loud(request: Request, ctx: RunContext) -> Result:
    return Result(output=LOUD_OUTPUT, files_changed=LOUD_FILES)


@pytest.mark.parametrize("mode", list(VERSIONS))
async def test_structured_content_is_cut_to_the_bound_of_the_content(mode: str) -> None:
    spec = AgentSpec(name="loud", description="Says a lot.", runner=loud)
    async with SubagentManager([spec]) as manager:
        toolset = build_tools(manager, "root")
        limit = toolset.limits.truncate_chars
        async with Client(serve(toolset), raise_exceptions=True, mode=mode) as client:
            delegated = await client.call_tool("delegate_to_agent", {"agent": "loud", "input": "x"})
            ids = []
            for _ in range(3):
                spawned = await client.call_tool("spawn_agent", {"agent": "loud", "input": "x"})
                ids.append(check_structured(toolset, "spawn_agent", spawned)["task_id"])
            waited = await client.call_tool("wait_agent", {"task_ids": ids, "timeout_ms": 5000})
        host = await toolset.call("delegate_to_agent", {"agent": "loud", "input": "x"})
    envelope = check_structured(toolset, "delegate_to_agent", delegated)["envelope"]
    details = check_structured(toolset, "wait_agent", waited)
    assert len(details["results"]) == 3
    for name, result in (("delegate_to_agent", delegated), ("wait_agent", waited)):
        text = result.content[0]
        assert isinstance(text, types.TextContent)
        assert len(text.text) <= limit
        assert len(dumps_str(result.structured_content)) <= limit, name
    for cut in (envelope, *details["results"]):
        # The output keeps its start and its end, like the text; the paths their first few.
        assert cut["output"].startswith(LOUD_OUTPUT[:8])
        assert cut["output"].endswith(LOUD_OUTPUT[-4:])
        assert "characters truncated" in cut["output"]
        assert cut["files_changed"][-1].endswith("more paths]")
    # The host's details keep the whole envelope.
    whole = host.details["envelope"]
    assert isinstance(whole, dict)
    assert whole["output"] == LOUD_OUTPUT
    assert whole["files_changed"] == list(LOUD_FILES)


def _details(output: str, files: list[JSONValue]) -> dict[str, JSONValue]:
    return {
        "completed": True,
        "task_id": "0123456789ab",
        "results": [
            {"task_id": "0123456789ab", "status": "completed", "output": output},
            {"task_id": "ba9876543210", "status": "error", "files_changed": files},
        ],
        "deferred": ["aaaaaaaaaaaa"],
    }


def test_bounded_details_fit_the_bound_and_keep_their_shape() -> None:
    files: list[JSONValue] = [*(f"src/{i}.py" for i in range(2000)), "[… 7 more paths]"]
    details = _details('\x00"' * 50_000, files)  # escapes weigh 6 and 2 characters
    before = copy.deepcopy(details)
    cut = bounded_details(details, 2000)
    assert details == before  # the host's details are not touched
    assert 1800 < len(dumps_str(cut)) <= 2000  # little of the bound is left unused
    first, second = cut["results"]  # type: ignore[misc]
    assert "characters truncated" in first["output"]  # type: ignore[index]
    kept = second["files_changed"]  # type: ignore[index]
    assert kept[:-1] == files[: len(kept) - 1]
    assert kept[-1] == f"[… {2000 + 7 - (len(kept) - 1)} more paths]"
    # Everything but the free text is as it was.
    assert {k: v for k, v in cut.items() if k != "results"} == {
        k: v for k, v in details.items() if k != "results"
    }
    assert (first["task_id"], second["status"]) == ("0123456789ab", "error")  # type: ignore[index]


def test_bounded_details_too_big_to_fit_are_as_small_as_their_shape_allows() -> None:
    cut = bounded_details(_details("y" * 10_000, [f"src/{i}.py" for i in range(50)]), 100)
    first, second = cut["results"]  # type: ignore[misc]
    assert "characters truncated" in first["output"]  # type: ignore[index]
    assert len(first["output"]) <= KEEP  # type: ignore[index]
    assert second["files_changed"] == ["[… 50 more paths]"]  # type: ignore[index]
    small = _details("short", ["a.py"])
    assert bounded_details(small, 100) == small
