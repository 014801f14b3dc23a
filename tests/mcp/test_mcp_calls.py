"""``tools/call`` over MCP through the SDK's in-memory client, on both protocol versions:
spawn → wait → result, delegate, cancel, list, and bad arguments as ``isError`` results
naming the field. The SDK checks every result against the protocol version's schema on
the way out (an invalid one would reach the client as error -32603), and the client checks
the ``structuredContent`` of each successful one against the tool's ``outputSchema``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from subagents import SubagentConfig
from tests.mcp.support import MODES, Gates, connected, spawn, structured, text

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", MODES)
async def test_spawn_then_wait_returns_the_result(mode: str) -> None:
    async with connected(mode) as (manager, client):
        task_id = await spawn(client, "echo", "hello")
        waited = await client.call_tool("wait_agent", {"task_ids": [task_id]})
        assert manager.handle(task_id).collected
    assert waited.is_error is False
    details = structured(waited)
    assert details["completed"] is True
    [envelope] = details["results"]
    assert (envelope["task_id"], envelope["status"]) == (task_id, "completed")
    assert envelope["output"] == "echo: hello"
    assert "echo: hello" in text(waited)


@pytest.mark.parametrize("mode", MODES)
async def test_delegate_runs_the_child_and_answers_with_its_envelope(mode: str) -> None:
    async with connected(mode) as (_, client):
        delegated = await client.call_tool("delegate_to_agent", {"agent": "echo", "input": "x"})
    assert delegated.is_error is False
    details = structured(delegated)
    assert details["status"] == "completed"
    assert details["envelope"]["output"] == "echo: x"
    assert "echo: x" in text(delegated)


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_stops_a_running_child_whose_envelope_wait_then_returns(mode: str) -> None:
    gates = Gates()
    async with connected(mode, gates.spec) as (_, client):
        task_id = await spawn(client, "gated", "never opened")
        cancelled = await client.call_tool("cancel_agent", {"task_id": task_id})
        again = await client.call_tool("cancel_agent", {"task_id": task_id})
        waited = await client.call_tool("wait_agent", {"task_ids": task_id})
    assert cancelled.is_error is False
    details = structured(cancelled)
    assert details["task_id"] == task_id
    assert details["previous_status"] in ("queued", "running")
    assert details["cancel_requested"] is True
    assert again.is_error is False  # idempotent: a repeat is an answer, not an error
    assert structured(again)["cancel_requested"] is False
    [envelope] = structured(waited)["results"]
    assert envelope["status"] == "cancelled"


@pytest.mark.parametrize("mode", MODES)
async def test_list_names_the_agent_types_and_the_sessions_children(mode: str) -> None:
    gates = Gates()
    async with connected(mode, gates.spec) as (manager, client):
        running = await spawn(client, "gated", "a")
        done = await spawn(client, "echo", "b")
        await manager.handle(done).done.wait()  # ended, not collected
        listed = await client.call_tool("list_agents", {})
        gates.open("a")
    assert listed.is_error is False
    details = structured(listed)
    assert [agent["name"] for agent in details["agents"]] == ["echo", "gated"]
    tasks = {task["task_id"]: task for task in details["tasks"]}
    assert tasks[running]["status"] == "running"
    assert tasks[done]["status"] == "completed"
    assert tasks[done]["result_waiting"] is True
    assert running in text(listed)


BAD_ARGUMENTS = [
    ("spawn_agent", {"agent": "echo"}, "input"),
    ("spawn_agent", {"agent": "echo", "input": "x", "name": "bad name!"}, "name"),
    ("spawn_agent", {"agent": "echo", "input": "x", "timeout_ms": 0}, "timeout_ms"),
    ("wait_agent", {"task_id": "0123456789ab"}, "task_id"),
    ("wait_agent", {"task_ids": "0123456789ab", "timeout_ms": -5}, "timeout_ms"),
    ("wait_agent", {"task_ids": "0123456789ab", "mode": "some"}, "mode"),
    ("wait_agent", {"task_ids": [" "]}, "task_ids"),
    ("delegate_to_agent", {"agent": 7, "input": "x"}, "agent"),
    ("cancel_agent", {}, "task_id"),
    ("list_agents", {"verbose": True}, "verbose"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("tool", "arguments", "field"), BAD_ARGUMENTS)
async def test_bad_arguments_are_an_error_result_naming_the_field(
    mode: str, tool: str, arguments: dict[str, Any], field: str
) -> None:
    async with connected(mode) as (manager, client):
        result = await client.call_tool(tool, arguments)
        assert manager.statistics().spawned == 0
    assert result.is_error is True
    assert structured(result) == {"error": "invalid_arguments", "field": field}
    assert text(result).startswith("invalid arguments: ")
    assert field in text(result)


@pytest.mark.parametrize("mode", MODES)
async def test_a_refused_task_id_is_never_looked_up_in_the_store(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``wait_agent`` call whose arguments the toolset refuses does nothing else first:
    the server's progress reporter looks its ids up only once the toolset has validated
    them."""
    config = SubagentConfig(store_path=tmp_path / "runs.db")
    async with connected(mode, config=config) as (_, client):
        with caplog.at_level(logging.WARNING, logger="subagents"):
            result = await client.call_tool("wait_agent", {"task_ids": "\ud800"})
    assert result.is_error is True
    assert structured(result) == {"error": "invalid_arguments", "field": "task_ids"}
    # A lookup by the reporter would log a store failure for an argument the toolset
    # refused, which never was the store's business.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.parametrize("mode", MODES)
async def test_unknown_names_are_error_results_not_protocol_errors(mode: str) -> None:
    async with connected(mode) as (_, client):
        tool = await client.call_tool("spawn_agents", {})
        agent = await client.call_tool("spawn_agent", {"agent": "nope", "input": "x"})
        task = await client.call_tool("wait_agent", {"task_ids": "0123456789ab"})
    assert (tool.is_error, agent.is_error, task.is_error) == (True, True, True)
    assert structured(tool)["error"] == "unknown_tool"
    assert "spawn_agent" in text(tool)
    assert structured(agent) == {"error": "unknown_agent", "agent": "nope", "known": ["echo"]}
    assert structured(task)["error"] == "unknown_task"
    assert "0123456789ab" in text(task)
