"""Helpers of the MCP tests: gated agents, and the SDK's in-memory ``Client`` connected to
:func:`subagents.mcp.build_server` on either protocol version."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp import Client

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager
from subagents.mcp import build_server
from subagents.testing import echo_agent

MODES = {"auto": "2026-07-28", "legacy": "2025-11-25"}
"""The client's ``mode`` and the protocol version it speaks: ``auto`` dispatches to the
in-process server directly (2026-07-28, no handshake), ``legacy`` runs the initialize
handshake and JSON-RPC over memory streams (2025-11-25)."""


class Gates:
    """An agent ``gated`` whose run for input ``x`` ends once ``open(x)`` is called."""

    def __init__(self) -> None:
        self._events: dict[str, anyio.Event] = {}
        self.spec = AgentSpec(name="gated", description="Waits for its gate.", runner=self._run)

    def _event(self, key: str) -> anyio.Event:
        return self._events.setdefault(key, anyio.Event())

    async def _run(self, request: Request, ctx: RunContext) -> str:
        await self._event(request.input).wait()
        return f"opened {request.input}"

    def open(self, *keys: str) -> None:
        for key in keys:
            self._event(key).set()


@asynccontextmanager
async def connected(
    mode: str, *specs: AgentSpec, config: SubagentConfig | None = None, **server: Any
) -> AsyncIterator[tuple[SubagentManager, Client]]:
    """A manager with ``echo`` and ``specs``, served by ``build_server(manager, "root",
    **server)`` to an in-memory client speaking ``mode``."""
    async with SubagentManager([echo_agent(), *specs], config=config) as manager:
        app = build_server(manager, "root", **server)
        async with Client(app, raise_exceptions=True, mode=mode) as client:
            assert client.protocol_version == MODES[mode]
            yield manager, client


def text(result: types.CallToolResult) -> str:
    """The one text block of a tool result."""
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


def structured(result: types.CallToolResult) -> dict[str, Any]:
    content = result.structured_content
    assert isinstance(content, dict)
    return content


async def spawn(client: Client, agent: str, task: str) -> str:
    """``spawn_agent`` over MCP; the new task's id."""
    result = await client.call_tool("spawn_agent", {"agent": agent, "input": task})
    assert result.is_error is False, text(result)
    task_id = structured(result)["task_id"]
    assert isinstance(task_id, str)
    return task_id
