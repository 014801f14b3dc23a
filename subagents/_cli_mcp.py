"""``subagents mcp serve --agents MODULE:NAME``: the subagent tools as an MCP server.

The manager is opened before the server starts and closed after it stops (when the client
closes stdin, or the process is interrupted), so the children belong to the process, never
to a request. With ``--store PATH`` the manager runs on a durable store: a restarted
server still answers ``wait_agent`` for the tasks of an earlier one. With ``--messaging
--room PATH`` the session is bridged to a room of that store file (``subagents.room.bridge``):
the messaging tools reach the members of other processes.

The SDK (``subagents[mcp]``) is imported only once the command runs, so every other
command works without it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import anyio
import anyio.abc

from ._cli_events import positive_seconds
from ._cli_specs import SpecsError, load_specs, specs_reference
from ._errors import SubagentsError
from ._manager import DEFAULT_SESSION, SubagentManager
from ._spec import AgentSpec, SubagentConfig
from .room import Room, bridge

__all__ = ["register"]

_INSTALL = "pip install 'subagents[mcp]'"


def register(commands: Any) -> None:
    """Add the ``mcp`` command (``serve``) to an argparse subparsers object."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "mcp", help="serve the subagent tools to an MCP host (needs subagents[mcp])"
    )
    sub = parser.add_subparsers(dest="mcp_command", required=True, metavar="SUBCOMMAND")
    serve = sub.add_parser(
        "serve",
        help="run an MCP server: spawn_agent, wait_agent, delegate_to_agent, cancel_agent, "
        "list_agents",
        description="Run an MCP server whose tools spawn, wait for, delegate to, cancel and "
        "list subagents of the agent specs MODULE:NAME names. Over stdio (the default) it "
        "serves the host that started it and stops when the host closes stdin.",
    )
    serve.add_argument(
        "--agents",
        required=True,
        type=specs_reference,
        metavar="MODULE:NAME",
        help="the agent specs: an AgentSpec, a list or mapping of them, or a function "
        "returning one (imported from the current directory first)",
    )
    serve.add_argument(
        "--transport", choices=("stdio", "streamable-http"), default="stdio", help="(default stdio)"
    )
    serve.add_argument("--store", metavar="PATH", help="keep every task in this durable store")
    serve.add_argument(
        "--session",
        type=_session,
        default=DEFAULT_SESSION,
        help=f"the session the client acts as (default {DEFAULT_SESSION})",
    )
    serve.add_argument("--host", default="127.0.0.1", help="streamable-http (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=_port, default=8000, help="streamable-http, 0 for a free one (default 8000)"
    )
    serve.add_argument(
        "--wait-cap",
        type=_seconds_between(0.0, 600.0),
        default=45.0,
        metavar="SECONDS",
        help="the longest one wait_agent call waits, at most 600 (default 45)",
    )
    serve.add_argument(
        "--progress-every",
        type=_seconds_between(0.05, None),
        default=5.0,
        metavar="SECONDS",
        help="progress notifications while wait_agent waits, at least 0.05 (default every 5)",
    )
    serve.add_argument(
        "--messaging",
        action="store_true",
        help="also offer send_message, read_messages and send_input (the client is the "
        "session's host)",
    )
    serve.add_argument(
        "--room",
        metavar="PATH",
        help="with --messaging: bridge the session to a room of this store file, so "
        "send_message and read_messages reach members of other processes",
    )
    serve.add_argument(
        "--room-name", default="default", metavar="NAME", help="the room joined (default default)"
    )
    serve.add_argument(
        "--harness-key",
        metavar="UUID",
        help="join the room as the member that joined with this key (after a restart: what "
        "was handed on and not read comes again); default a new one, printed on stderr",
    )
    serve.set_defaults(func=_run_serve)


def _session(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be from 0 to 65535, got {value}")
    return value


def _seconds_between(low: float, high: float | None) -> Callable[[str], float]:
    """An argparse ``type``: seconds > ``low`` (> 0) or >= ``low``, and <= ``high``."""

    def parse(text: str) -> float:
        value = positive_seconds(text)
        if value < low or (high is not None and value > high):
            bound = (
                f"at most {high:g}" if high is not None and value > high else f"at least {low:g}"
            )
            raise argparse.ArgumentTypeError(f"must be {bound} seconds, got {text}")
        return value

    return parse


def _run_serve(args: argparse.Namespace) -> int:
    if args.room is not None and not args.messaging:
        return _fail("--room needs --messaging (the room is reached by the messaging tools)")
    try:
        specs = load_specs(args.agents)
    except SpecsError as exc:
        return _fail(f"--agents: {exc}")
    try:
        # Deferred to here: the SDK is an optional extra, and no other command needs it.
        from . import mcp as server_module
    except ModuleNotFoundError as exc:
        return _fail(f"needs the MCP SDK ({exc}); install it: {_INSTALL}")
    try:
        # An empty path is the config's to refuse, never "no store".
        config = SubagentConfig(store_path=args.store) if args.store is not None else None
        stopped_by = anyio.run(_serve, args, specs, config or SubagentConfig(), server_module)
    except (SubagentsError, OSError) as exc:  # a store that cannot be opened, a busy port
        return _fail(str(exc))
    # Ctrl-C: the command line's conventional status; SIGTERM is how a host stops a server.
    return 130 if stopped_by == signal.SIGINT else 0


async def _serve(
    args: argparse.Namespace,
    specs: list[AgentSpec],
    config: SubagentConfig,
    server_module: ModuleType,
) -> int | None:
    """Serve until the client leaves (over stdio: closes stdin) or a signal comes; returns
    the signal, if one came. The manager is opened before the server starts and closed
    after it stops, so its children end and the store is closed cleanly.

    Raises:
        SubagentsError: the store cannot be opened, or the server refuses an option.
        OSError: the port cannot be listened on.
    """
    stop, closed = anyio.Event(), anyio.Event()
    # Raised plain once the task group is left: inside it, it would come out wrapped in
    # an exception group.
    refused: SubagentsError | OSError | None = None
    stopped_by: int | None = None
    async with anyio.create_task_group() as group:
        try:
            manager = await group.start(_open_manager, specs, config, stop, closed, args)
        except SubagentsError as exc:  # a store that cannot be opened
            refused = exc
        else:
            try:
                stopped_by = await _serve_until_stopped(args, manager, server_module, stop, closed)
            except (SubagentsError, OSError) as exc:
                refused = exc
            finally:
                stop.set()
    if refused is not None:
        raise refused
    return stopped_by


async def _serve_until_stopped(
    args: argparse.Namespace,
    manager: SubagentManager,
    server_module: ModuleType,
    stop: anyio.Event,
    closed: anyio.Event,
) -> int | None:
    server = server_module.build_server(
        manager,
        args.session,
        wait_cap=args.wait_cap,
        progress_every=args.progress_every,
        messaging=args.messaging,
    )
    stopped_by: int | None = None
    refused: OSError | None = None
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as serving:

            async def stop_on_signal() -> None:
                nonlocal stopped_by
                async for signum in signals:
                    stopped_by = signum
                    if args.transport == "stdio":
                        # The SDK reads stdin in a worker thread that no cancellation
                        # reaches: the server cannot stop before the host closes stdin.
                        # Close the manager, then end as the signal would have: nothing
                        # of ours is left to lose.
                        stop.set()
                        await closed.wait()
                        signal.signal(signum, signal.SIG_DFL)
                        signal.raise_signal(signum)
                    # uvicorn (streamable HTTP) takes the signal too, shuts its
                    # connections down itself and raises it again once done.

            serving.start_soon(stop_on_signal)
            try:
                await server_module.serve(
                    server, transport=args.transport, host=args.host, port=args.port
                )
            except OSError as exc:  # nothing served: raised plain, below
                refused = exc
            serving.cancel_scope.cancel()
    if refused is not None:
        raise refused
    return stopped_by


async def _open_manager(
    specs: list[AgentSpec],
    config: SubagentConfig,
    stop: anyio.Event,
    closed: anyio.Event,
    args: argparse.Namespace,
    *,
    task_status: anyio.abc.TaskStatus[SubagentManager],
) -> None:
    """Enter the manager (bridged to ``--room``, if given), hand it over, and close it once
    ``stop`` is set: in a task of its own, since a manager is closed by the task that
    entered it and the serving task may be stuck in the SDK's stdin read."""
    try:
        async with SubagentManager(specs, config=config) as manager:
            if args.room is None:
                task_status.started(manager)
                await stop.wait()
                return
            async with (
                Room(args.room) as room,
                bridge(
                    room, manager, args.session, room_name=args.room_name,
                    harness_key=args.harness_key,
                ) as link,
            ):  # fmt: skip
                print(
                    f"subagents mcp serve: session {args.session!r} is member "
                    f"{link.member_id} of room {link.room!r} in {args.room} "
                    f"(harness key {link.harness_key})",
                    file=sys.stderr,
                    flush=True,
                )
                task_status.started(manager)
                await stop.wait()
    finally:
        closed.set()


def _fail(message: str) -> int:
    print(f"subagents mcp serve: {message}", file=sys.stderr)
    return 1
