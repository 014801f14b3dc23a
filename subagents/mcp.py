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
import logging
import socket
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
_MIN_PROGRESS_EVERY: Final = 0.05
"""The shortest progress period (s): each notification is a message the host must read."""

Transport = Literal["stdio", "streamable-http"]

_CallContext = ServerRequestContext[None, Any]


def build_server(
    manager: SubagentManager,
    session_id: str,
    *,
    wait_cap: float = 45.0,
    progress_every: float = 5.0,
    messaging: bool = False,
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
            asks for: it answers ``timed_out`` before a host's 60 s tool timeout. At most
            600 s, the toolset's ceiling for a wait no host timeout bounds.
        progress_every: while ``wait_agent`` waits, a request that carries a progress
            token gets a notification every ``progress_every`` seconds (at least 0.05):
            ``progress`` is the seconds waited (so it always increases), ``message``
            "n of m finished". None is sent after the result.
        messaging: also offer ``send_message``, ``read_messages`` and ``send_input``, the
            client acting as host session ``session_id`` (design/messaging.md).

    Raises:
        ConfigError: ``session_id`` is empty, ``wait_cap`` is not a finite number of
            seconds > 0 and <= 600, or ``progress_every`` not one >= 0.05.
    """
    cap = seconds("wait_cap", wait_cap, none_ok=False, zero_ok=False)
    every = seconds("progress_every", progress_every, none_ok=False, zero_ok=False)
    if every < _MIN_PROGRESS_EVERY:
        raise ConfigError("progress_every", f"at least {_MIN_PROGRESS_EVERY:g} s", progress_every)
    toolset = build_tools(
        manager,
        session_id,
        engine_tool_timeout=_HOST_TOOL_TIMEOUT,
        tool_timeouts={"wait_agent": None},
        wait_timeout=min(_DEFAULT_WAIT, cap),
        wait_cap=cap,
        messaging=messaging,
    )
    if toolset.limits.wait_ceiling < cap:  # the toolset's own ceiling would clamp it
        raise ConfigError("wait_cap", f"at most {toolset.limits.wait_ceiling:g} s", wait_cap)
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
    process is interrupted; ``port`` 0 takes a free one. Cancelling the call stops the
    server; the manager behind it stays open.

    Raises:
        ConfigError: ``transport`` is neither, or ``port`` is not an integer from 0 to
            65535.
        OSError: ``host`` and ``port`` cannot be listened on (in use, not this machine's);
            the message names them.
    """
    if transport == "stdio":
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    elif transport == "streamable-http":
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= _MAX_PORT:
            raise ConfigError("port", f"an integer from 0 to {_MAX_PORT}", port)
        app = server.streamable_http_app(host=host)
        # Bound here rather than by uvicorn, which logs a failure and exits the process.
        listening = _listen(host, port)
        try:
            config = uvicorn.Config(app, host=host, port=port)
            # What uvicorn says when it binds itself (it says nothing of given sockets).
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on http://%s (Press CTRL+C to quit)", _address(listening[0])
            )
            await uvicorn.Server(config).serve(listening)
        finally:
            for sock in listening:
                sock.close()
    else:
        raise ConfigError("transport", "'stdio' or 'streamable-http'", transport)


_MAX_PORT: Final = 65535


def _listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to, as uvicorn's own binding
    does (``localhost`` may be both 127.0.0.1 and ::1); with ``port`` 0, on the first.

    Raises:
        OSError: ``host`` does not resolve, or an address cannot be bound (then none is
            left open); the message names ``host:port``.
    """
    listening: list[socket.socket] = []
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, address in dict.fromkeys((info[0], info[4]) for info in found):
            sock = socket.socket(family, socket.SOCK_STREAM)
            listening.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen()
            if port == 0:  # one free port: a second address would get another one
                break
    except OSError as exc:
        for sock in listening:
            sock.close()
        reason = exc.strerror or str(exc)
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {reason}") from exc
    return listening


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


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
        """The children a ``wait_agent`` call names, or ``None`` when the toolset refuses
        its arguments or one id is not this session's: then it answers at once with an
        error and there is no wait to report on. The ids are looked up only once the
        toolset's own parser accepted them."""
        tool = self._toolset.get("wait_agent")
        assert tool is not None
        try:
            ids = tool.parse_arguments(arguments)["task_ids"]
        except ValueError:
            return None
        assert isinstance(ids, list)
        manager, session_id = self._toolset.manager, self._toolset.session_id
        try:
            return [manager.handle(str(task_id), session_id=session_id) for task_id in ids]
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
