"""``tools/list`` over MCP: the toolset's five tools, each with valid input and output
schemas and the behaviour hints it deserves, on both protocol versions."""

from __future__ import annotations

import math

import pytest
from jsonschema import Draft202012Validator

from subagents import ConfigError, SubagentManager
from subagents.mcp import build_server, serve
from subagents.testing import echo_agent
from subagents.tools import build_tools
from tests.mcp.support import MODES, connected

pytestmark = pytest.mark.anyio

HINTS = {
    # it starts work that runs on and may act on the world; each call starts another
    "spawn_agent": (False, False, False, True),
    # it only reads, but it consumes the results it returns (a second call repeats them
    # marked "already collected"): not read-only, not idempotent
    "wait_agent": (False, False, False, False),
    "delegate_to_agent": (False, False, False, True),
    # it stops work for good; a repeat changes nothing more
    "cancel_agent": (False, True, True, False),
    "list_agents": (True, False, True, False),
}
"""(readOnlyHint, destructiveHint, idempotentHint, openWorldHint) of each tool."""


@pytest.mark.parametrize("mode", MODES)
async def test_the_five_tools_are_listed_with_valid_schemas(mode: str) -> None:
    async with connected(mode) as (manager, client):
        listed = await client.list_tools()
        # The toolset the server is built on: wait_agent bounded by the cap alone.
        toolset = build_tools(manager, "root", tool_timeouts={"wait_agent": None}, wait_cap=45)
    assert [tool.name for tool in listed.tools] == list(HINTS)
    for tool in listed.tools:
        assert tool.title
        assert tool.description
        Draft202012Validator.check_schema(tool.input_schema)
        assert tool.input_schema == toolset[tool.name].input_schema
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None
        Draft202012Validator.check_schema(tool.output_schema)
        assert tool.output_schema == toolset[tool.name].output_schema
        assert tool.output_schema["type"] == "object"


@pytest.mark.parametrize("mode", MODES)
async def test_each_tool_carries_honest_behaviour_hints(mode: str) -> None:
    async with connected(mode) as (_, client):
        listed = await client.list_tools()
    for tool in listed.tools:
        hints = tool.annotations
        assert hints is not None
        got = (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint)
        assert (*got, hints.open_world_hint) == HINTS[tool.name], tool.name


@pytest.mark.parametrize("mode", MODES)
async def test_the_listing_states_the_wait_cap(mode: str) -> None:
    async with connected(mode, wait_cap=12.5) as (_, client):
        listed = await client.list_tools()
        assert client.server_info is not None
        assert client.server_info.name == "subagents"
        assert client.instructions is not None
        assert "12500 ms" in client.instructions
    [wait] = [tool for tool in listed.tools if tool.name == "wait_agent"]
    assert wait.description is not None
    assert "at most 12500 ms" in wait.description


@pytest.mark.parametrize("mode", MODES)
async def test_by_default_a_wait_is_capped_at_45_seconds(mode: str) -> None:
    """Under the 60 s tool timeout many hosts enforce, with room to spare."""
    async with connected(mode) as (_, client):
        listed = await client.list_tools()
    [wait] = [tool for tool in listed.tools if tool.name == "wait_agent"]
    assert wait.description is not None
    assert "default 30000 ms, at most 45000 ms" in wait.description


@pytest.mark.parametrize(
    ("option", "value"),
    [("wait_cap", 0), ("wait_cap", -1.0), ("wait_cap", math.inf), ("wait_cap", 600.5),
     ("progress_every", 0), ("progress_every", math.nan), ("progress_every", "5"),
     ("progress_every", 0.049)],
)  # fmt: skip
async def test_build_server_refuses_a_bad_timing(option: str, value: object) -> None:
    async with SubagentManager([echo_agent()]) as manager:
        with pytest.raises(ConfigError, match=option):
            build_server(manager, "root", **{option: value})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="session_id"):
            build_server(manager, "")


async def test_build_server_takes_the_bounds_of_its_timings() -> None:
    async with SubagentManager([echo_agent()]) as manager:
        build_server(manager, "root", wait_cap=600, progress_every=0.05)


async def test_serve_refuses_a_port_out_of_range() -> None:
    async with SubagentManager([echo_agent()]) as manager:
        server = build_server(manager, "root")
        for port in (-1, 65536, True):
            with pytest.raises(ConfigError, match="port"):
                await serve(server, transport="streamable-http", port=port)


@pytest.mark.parametrize("mode", MODES)
async def test_messaging_adds_send_message_and_read_messages(mode: str) -> None:
    async with connected(mode, messaging=True) as (manager, client):
        listed = await client.list_tools()
        toolset = build_tools(manager, "root", messaging=True)
        sent = await client.call_tool("send_message", {"to": "*", "message": "hello"})
        read = await client.call_tool("read_messages", {})
    assert [tool.name for tool in listed.tools] == [
        *HINTS,
        "send_message",
        "read_messages",
        "send_input",
    ]
    for tool in listed.tools[len(HINTS) :]:
        Draft202012Validator.check_schema(tool.input_schema)
        # The same fields (the descriptions name the wait ceilings, set by the server).
        assert tool.input_schema.keys() == toolset[tool.name].input_schema.keys()
        assert (
            tool.input_schema["properties"].keys()
            == toolset[tool.name].input_schema["properties"].keys()
        )
    assert sent.structured_content is not None
    assert sent.structured_content["receipts"] == []  # nobody live to broadcast to
    assert not read.is_error
