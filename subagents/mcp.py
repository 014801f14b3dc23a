"""The MCP server: the LLM tools of one session served over the Model Context Protocol,
with the official SDK (``pip install 'subagents[mcp]'``, ``mcp`` 2.x).

:func:`build_server` wraps :func:`~subagents.tools.build_tools` in the SDK's low-level
``Server``: ``tools/list`` answers with the toolset's definitions (input and output
schemas, behaviour hints), ``tools/call`` with :meth:`ToolResult.to_mcp` (text, the
bounded ``structuredContent``, ``isError``; valid on protocol 2026-07-28 and 2025-11-25).
:func:`serve` runs a server over stdio or streamable HTTP until its client leaves.

This is the one module that imports the SDK; nothing else in the package imports this one
but the ``subagents mcp serve`` command, and only once it runs. See design/mcp.md.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
import uvicorn
from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server

from ._errors import ConfigError
from ._handle import SpawnHandle
from ._validators import seconds
from .tools import ToolResult, Toolset, build_tools

if TYPE_CHECKING:
    from ._manager import SubagentManager

__all__ = ["build_server", "serve"]

_HOST_TOOL_TIMEOUT: Final = 60.0
"""The per-call timeout (s) many MCP hosts enforce. ``delegate_to_agent`` stops its child
before it (at 54 s); ``wait_agent`` is bounded by ``wait_cap`` instead, since a host may
reset its timer on progress or set none."""
_DEFAULT_WAIT: Final = 30.0
"""``wait_agent``'s wait when the model gives no ``timeout_ms`` (at most ``wait_cap``)."""

Transport = Literal["stdio", "streamable-http"]

_CallContext = ServerRequestContext[None, Any]


def build_server(
    manager: SubagentManager,
    session_id: str,
    *,
    wait_cap: float = 45.0,
    progress_every: float = 5.0,
) -> Server[None]:
    """An MCP server whose tools spawn, wait for, delegate to, cancel and list the
    subagents of ``session_id`` on ``manager``.

    The children belong to ``manager``, never to a request: a call the client cancels
    ends only that call (a cancelled ``wait_agent`` consumes nothing, and its children run
    on and stay collectable), and the server never closes the manager. Keep the manager
    open (``async with``) for as long as the server runs.

    Args:
        manager: the running :class:`~subagents.SubagentManager`.
        session_id: the parent session the client acts as (a manager's default is
            ``"root"``).
        wait_cap: the longest one ``wait_agent`` call waits (s), whatever ``timeout_ms``
            asks for: it answers ``timed_out`` before a host's 60 s tool timeout.
        progress_every: while ``wait_agent`` waits, a request that carries a progress
            token gets a notification every ``progress_every`` seconds: ``progress`` is
            the seconds waited (so it always increases), ``message`` "n of m finished".
            None is sent after the result.

    Raises:
        ConfigError: ``session_id`` is empty, or ``wait_cap`` or ``progress_every`` is not
            a finite number of seconds > 0.
    """
    cap = seconds("wait_cap", wait_cap, none_ok=False, zero_ok=False)
    every = seconds("progress_every", progress_every, none_ok=False, zero_ok=False)
    toolset = build_tools(
        manager,
        session_id,
        engine_tool_timeout=_HOST_TOOL_TIMEOUT,
        tool_timeouts={"wait_agent": None},
        wait_timeout=min(_DEFAULT_WAIT, cap),
        wait_cap=cap,
    )
    tools = _Tools(toolset, every)
    listing = types.ListToolsResult.model_validate({"tools": toolset.to_mcp()})

    async def list_tools(
        ctx: _CallContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    async def call_tool(
        ctx: _CallContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        result = await tools.call(ctx, params.name, params.arguments)
        return types.CallToolResult.model_validate(result.to_mcp())

    def input_schema(name: str) -> Mapping[str, Any] | None:
        tool = toolset.get(name)
        return None if tool is None else tool.input_schema

    return Server(
        "subagents",
        version=_version(),
        title="subagents",
        instructions=_instructions(toolset),
        lifespan=_no_state,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve(
    server: Server[None],
    *,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
) -> None:
    """Run ``server`` until its client leaves; blocks.

    ``stdio`` (the default) serves one client over this process's stdin and stdout (so
    nothing else may write to stdout) and returns when stdin closes. ``streamable-http``
    serves ``http://{host}:{port}/mcp`` (asyncio only: it runs on uvicorn) until the
    process is interrupted. Cancelling the call stops the server; the manager behind it
    stays open.

    Raises:
        ConfigError: ``transport`` is neither.
    """
    if transport == "stdio":
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    elif transport == "streamable-http":
        app = server.streamable_http_app(host=host)
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port)).serve()
    else:
        raise ConfigError("transport", "'stdio' or 'streamable-http'", transport)


class _Tools:
    """The toolset's calls as the server makes them: ``wait_agent`` with progress."""

    def __init__(self, toolset: Toolset, progress_every: float) -> None:
        self._toolset = toolset
        self._every = progress_every

    async def call(
        self, ctx: _CallContext, name: str, arguments: dict[str, Any] | None
    ) -> ToolResult:
        call_id = None if ctx.request_id is None else str(ctx.request_id)
        handles = self._waited_on(arguments) if name == "wait_agent" else None
        if not handles:
            return await self._toolset.call(name, arguments, call_id=call_id)
        async with anyio.create_task_group() as reporting:
            reporting.start_soon(self._report, ctx.session, handles)
            result = await self._toolset.call(name, arguments, call_id=call_id)
            # Stopped before the result is returned, so no notification follows it.
            reporting.cancel_scope.cancel()
        return result

    def _waited_on(self, arguments: dict[str, Any] | None) -> list[SpawnHandle] | None:
        """The children a ``wait_agent`` call names, or ``None`` when its arguments are
        not a set of this session's ids: then the tool answers at once with an error and
        there is no wait to report on."""
        ids = None if arguments is None else arguments.get("task_ids")
        if isinstance(ids, str):
            ids = [ids]
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return None
        manager, session_id = self._toolset.manager, self._toolset.session_id
        try:
            return [manager.handle(task_id, session_id=session_id) for task_id in ids]
        except LookupError:
            return None

    async def _report(self, session: ServerSession, handles: list[SpawnHandle]) -> None:
        """Every ``progress_every`` seconds, how many of ``handles`` have finished; a no-op
        per tick when the request carries no progress token."""
        start = anyio.current_time()
        for tick in itertools.count(1):
            waited = tick * self._every
            await anyio.sleep_until(start + waited)
            finished = sum(1 for handle in handles if handle.result is not None)
            await session.report_progress(waited, None, f"{finished} of {len(handles)} finished")


@asynccontextmanager
async def _no_state(server: Server[None]) -> AsyncIterator[None]:
    """The server keeps no state of its own: the manager it was built on has it all."""
    yield None


def _version() -> str:
    try:
        return metadata.version("subagents")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return ""


def _instructions(toolset: Toolset) -> str:
    cap = int(toolset.limits.wait_ceiling * 1000)
    return (
        "Subagents: spawn_agent starts one in the background and answers at once with its "
        "task id; wait_agent collects results (each call answers within "
        f"{cap} ms; call it again to keep waiting); delegate_to_agent runs one and waits for "
        "it; cancel_agent stops one; list_agents lists the agent types and your subagents. "
        "The subagents keep running between calls."
    )
