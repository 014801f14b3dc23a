"""The tools of one session: :class:`Toolset` and :func:`build_tools`.

:func:`build_tools` enforces the timeout layering rule: ``wait_agent`` always answers
before the host's own per-tool timeout would kill it, and a delegated child is stopped
before ``delegate_to_agent``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

import attrs

from .._envelope import bound_text
from .._errors import ConfigError
from .._json import JSONValue
from .._manager import telemetry_of
from .._tool_tracing import ToolSpan
from .._tracing import Telemetry
from .._validators import seconds
from ._handlers import build_session_tools
from ._messaging import MESSAGE_TOOL_NAMES, WAITING_TOOL_NAMES, build_message_tools
from ._tool import Tool, ToolLimits, ToolResult, arguments_text, traced

if TYPE_CHECKING:
    from .._manager import SubagentManager

__all__ = ["Toolset", "build_tools"]

logger = logging.getLogger("subagents.tools")

WAIT_MARGIN_RATIO: Final = 0.1
"""The safety margin is 10 % of the host's timeout for the tool ..."""
WAIT_MARGIN_MIN: Final = 0.02
"""... and never less than 20 ms (only sub-second, test-scaled timeouts reach it)."""
NO_HOST_TIMEOUT_WAIT_CAP: Final = 600.0
"""Without a host timeout, no single ``wait_agent`` call blocks longer than this (s)."""


def wait_margin(engine_timeout: float) -> float:
    """The safety margin (seconds) kept between a blocking tool's own deadline and the
    host's timeout ``engine_timeout`` for it: ``max(0.1 * engine_timeout, 0.02)``."""
    return max(WAIT_MARGIN_RATIO * engine_timeout, WAIT_MARGIN_MIN)


class Toolset:
    """The tools of one session, iterable, callable by name and exportable.

    Built by :func:`build_tools`. ``call`` never raises (see :meth:`Tool.execute`).
    """

    def __init__(
        self,
        tools: Iterable[Tool],
        *,
        manager: SubagentManager,
        session_id: str,
        limits: ToolLimits,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._telemetry = telemetry
        self.manager = manager
        """The manager the tools act on."""
        self.session_id = session_id
        """The parent session whose children the tools spawn and collect."""
        self.limits = limits
        """The timeouts and bounds in force."""

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    @property
    def names(self) -> list[str]:
        """The tool names, in definition order."""
        return list(self._tools)

    @property
    def tools(self) -> list[Tool]:
        """The tools, in definition order."""
        return list(self._tools.values())

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None``."""
        return self._tools.get(name)

    def timeout_for(self, name: str) -> float | None:
        """The host's per-tool timeout for ``name`` as given to :func:`build_tools`."""
        return self.limits.engine_timeouts.get(name)

    async def call(
        self, name: str, args: object = None, *, call_id: str | None = None
    ) -> ToolResult:
        """Run tool ``name`` with ``args``; an unknown name is an error result, not raised.

        Blocks as the tool does (only ``wait_agent`` and ``delegate_to_agent`` block, and
        both answer before the tool's host timeout). Cancelling the caller cancels the
        call; nothing is consumed by a cancelled ``wait_agent``.
        """
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            unknown = ToolResult(
                content=f"unknown tool {bound_text(repr(name), 80)}; available tools: "
                + ", ".join(self._tools),
                details={"error": "unknown_tool", "tools": list(self._tools)},
                is_error=True,
                content_limit=self.limits.truncate_chars,
            )

            async def answer(span: ToolSpan) -> ToolResult:
                return unknown

            capture = self.manager.config.capture_content
            return await traced(
                str(name),
                call_id,
                None,
                answer,
                capture=capture,
                arguments=arguments_text(args, None) if capture else None,
                telemetry=self._telemetry,
                session=self.session_id,
            )
        return await tool.execute(args, call_id=call_id)

    def to_openai_chat(self, *, strict: bool = False) -> list[JSONValue]:
        """Every tool as an OpenAI Chat Completions ``tools`` entry."""
        return [tool.to_openai_chat(strict=strict) for tool in self]

    def to_openai_responses(self, *, strict: bool = False) -> list[JSONValue]:
        """Every tool as an OpenAI Responses API ``tools`` entry."""
        return [tool.to_openai_responses(strict=strict) for tool in self]

    def to_anthropic(self) -> list[JSONValue]:
        """Every tool as an Anthropic Messages ``tools`` entry."""
        return [tool.to_anthropic() for tool in self]

    def to_mcp(self) -> list[JSONValue]:
        """Every tool as an MCP ``tools/list`` descriptor."""
        return [tool.to_mcp() for tool in self]

    def __repr__(self) -> str:
        return f"<Toolset session={self.session_id!r} tools={self.names}>"


TOOL_NAMES: Final = (
    "spawn_agent",
    "wait_agent",
    "delegate_to_agent",
    "cancel_agent",
    "list_agents",
)


def _seconds(field: str, value: object, *, allow_none: bool) -> float | None:
    return seconds(field, value, none_ok=allow_none, zero_ok=False)


def _wait_ceiling(
    effective: float | None, wait: float, wait_timeout: object, wait_cap: object
) -> float:
    """The longest one ``wait_agent`` call waits, given its host timeout ``effective``
    (``None``: none) and the cap; refuses a ``wait_timeout`` (``wait``) above it."""
    cap = _seconds("wait_cap", wait_cap, allow_none=True)
    if cap is not None and wait > cap:
        raise ConfigError("wait_timeout", f"at most the wait_cap of {cap:g} s", wait_timeout)
    if effective is None:
        ceiling = max(wait, NO_HOST_TIMEOUT_WAIT_CAP)
    else:
        margin = wait_margin(effective)
        ceiling = effective - margin
        if ceiling <= 0 or wait > ceiling:
            raise ConfigError(
                "wait_timeout",
                f"at most {max(ceiling, 0):g} s: wait_agent's host timeout of {effective:g} s "
                f"minus the {margin:g} s safety margin (raise tool_timeouts['wait_agent'] "
                "or lower wait_timeout)",
                wait_timeout,
            )
    return ceiling if cap is None else min(ceiling, cap)


def _message_ceiling(name: str, engine: float | None, wait_cap: object) -> float:
    """The longest wait of messaging tool ``name`` under its host timeout ``engine``."""
    cap = _seconds("wait_cap", wait_cap, allow_none=True)
    if engine is None:
        ceiling = NO_HOST_TIMEOUT_WAIT_CAP
    else:
        ceiling = engine - wait_margin(engine)
        if ceiling <= 0:
            raise ConfigError(
                f"tool_timeouts[{name!r}]",
                f"more than the {wait_margin(engine):g} s safety margin",
                engine,
            )
    return ceiling if cap is None else min(ceiling, cap)


def build_tools(
    manager: SubagentManager,
    session_id: str,
    *,
    engine_tool_timeout: float | None = 60.0,
    tool_timeouts: Mapping[str, float | None] | None = None,
    wait_timeout: float = 30.0,
    wait_cap: float | None = None,
    truncate_chars: int | None = None,
    return_mode: str = "envelope",
    messaging: bool = False,
) -> Toolset:
    """The LLM tools of ``session_id``: spawn, wait, delegate, cancel and list subagents;
    with ``messaging``, also ``send_message``, ``read_messages`` and ``send_input``
    (design/messaging.md).

    Args:
        manager: the running :class:`SubagentManager`.
        session_id: the parent session: the host's conversation (default manager session
            ``"root"``) or, inside a runner, ``ctx.session_id``.
        engine_tool_timeout: the host loop's default per-tool timeout in seconds
            (``None``: the host has none).
        tool_timeouts: the host's per-tool overrides by tool name; other names ignored.
        wait_timeout: how long ``wait_agent`` waits when the model gives no ``timeout_ms``.
        wait_cap: the longest one ``wait_agent`` call waits, when that is shorter than the
            layering rule's ceiling (``None``: the ceiling alone); a server whose clients
            reset their timeout on progress, or set none, bounds each call with it.
        truncate_chars: bound of the text a model reads from one call (default
            ``manager.config.truncate_chars``).
        return_mode: ``delegate_to_agent`` returns the ``"envelope"`` (default) or the
            legacy bare output ``"string"``; any other value falls back to the envelope.
        messaging: add the messaging tools, acting as ``session_id``'s own address (a
            host session, or inside a runner the child's task id); their waits
            (``wait_ms``, ``await_reply_ms``) are clamped below their own host timeouts
            by the same margin as ``wait_agent``'s.

    The layering rule: with ``effective = tool_timeouts.get("wait_agent",
    engine_tool_timeout)``, ``wait_timeout`` must be at most ``effective - margin``, the
    margin being ``max(0.1 * effective, 0.02)`` seconds; every ``timeout_ms`` a model asks
    for is clamped to that ceiling, so ``wait_agent`` answers ``timed_out`` before the host
    kills it. The same ceiling (with ``delegate_to_agent``'s own host timeout) bounds a
    delegated child. Without a host timeout, one wait lasts at most 600 s (or
    ``wait_timeout`` if that is longer).
    ``wait_cap`` lowers that ceiling further.
    ``Toolset.limits`` holds the resulting ceilings.

    Raises:
        ConfigError: a timeout is not positive, or ``wait_timeout`` breaks the rule or
            exceeds ``wait_cap``.
    """
    if not isinstance(session_id, str) or not session_id:
        raise ConfigError("session_id", "a non-empty string", session_id)
    default = _seconds("engine_tool_timeout", engine_tool_timeout, allow_none=True)
    if not isinstance(tool_timeouts, (Mapping, type(None))):
        raise ConfigError("tool_timeouts", "a mapping of tool name to seconds", tool_timeouts)
    overrides = dict(tool_timeouts or {})
    engine: dict[str, float | None] = {}
    for name in TOOL_NAMES + (MESSAGE_TOOL_NAMES if messaging else ()):
        if name in overrides:
            engine[name] = _seconds(f"tool_timeouts[{name!r}]", overrides[name], allow_none=True)
        else:
            engine[name] = default
    wait = _seconds("wait_timeout", wait_timeout, allow_none=False)
    assert wait is not None
    ceiling = _wait_ceiling(engine["wait_agent"], wait, wait_timeout, wait_cap)
    delegate_engine = engine["delegate_to_agent"]
    delegate_ceiling = None
    if delegate_engine is not None:
        delegate_ceiling = delegate_engine - wait_margin(delegate_engine)
        if delegate_ceiling <= 0:
            raise ConfigError(
                "tool_timeouts['delegate_to_agent']",
                f"more than the {wait_margin(delegate_engine):g} s safety margin",
                delegate_engine,
            )
    chars = manager.config.truncate_chars if truncate_chars is None else truncate_chars
    if isinstance(chars, bool) or not isinstance(chars, int) or chars < 200:
        raise ConfigError("truncate_chars", "an integer >= 200", truncate_chars)
    if return_mode not in ("envelope", "string"):
        logger.warning("unknown delegate return_mode %r; using 'envelope'", return_mode)
        return_mode = "envelope"
    limits = ToolLimits(
        engine_timeouts=engine,
        wait_timeout=wait,
        wait_ceiling=ceiling,
        delegate_ceiling=delegate_ceiling,
        truncate_chars=chars,
        return_mode="string" if return_mode == "string" else "envelope",
    )
    # The calls are traced with the manager's own telemetry (its providers, resolved once).
    telemetry = telemetry_of(manager)
    capture = manager.config.capture_content
    made = build_session_tools(manager, session_id, limits)
    if messaging:
        ceilings = {
            name: _message_ceiling(name, engine[name], wait_cap) for name in WAITING_TOOL_NAMES
        }
        made += build_message_tools(manager, session_id, limits, ceilings)
    tools = [
        attrs.evolve(tool, capture_content=capture, telemetry=telemetry, session=session_id)
        for tool in made
    ]
    return Toolset(
        tools, manager=manager, session_id=session_id, limits=limits, telemetry=telemetry
    )
