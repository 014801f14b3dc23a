"""LLM tools: :class:`Tool`, :class:`ToolResult` and :class:`ToolLimits`, plus the one
place where an exception becomes a result a model can act on.

A tool never raises into the host's loop: :meth:`Tool.execute` validates the arguments
(``_schema``), runs the handler inside an ``execute_tool`` span and turns every failure
into a :class:`ToolResult` with ``is_error=True``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Final, Literal

import anyio
import anyio.lowlevel
import attrs

from .._envelope import bound_text, describe_exception
from .._errors import (
    ConfigError,
    InvalidName,
    SpawnRejected,
    UnknownAgent,
    UnknownPeer,
    UnknownTask,
)
from .._json import JSONValue, dumps_str
from .._semconv import conversation_of
from .._tool_tracing import ToolSpan, tool_span
from .._tracing import Telemetry
from ._export import to_anthropic, to_mcp, to_openai_chat, to_openai_responses
from ._schema import ArgumentError, Param, parse_args, schema_for
from ._structured import bounded_details

__all__ = [
    "Handler",
    "ReturnMode",
    "Tool",
    "ToolLimits",
    "ToolResult",
    "arguments_text",
    "error_result",
    "make_tool",
    "traced",
]

logger = logging.getLogger("subagents.tools")

ReturnMode = Literal["envelope", "string"]


@attrs.frozen(kw_only=True)
class ToolResult:
    """What a tool call returns to the loop. Tool errors are data, never exceptions."""

    content: str
    """Text for the model, bounded by the toolset's truncation limit."""
    details: dict[str, JSONValue] = attrs.field(factory=dict)
    """Structured, JSON-serialisable data for the host (may hold full envelopes)."""
    is_error: bool = False
    """True when the call failed (bad arguments, unknown id, refusal)."""
    content_limit: int | None = None
    """The bound (characters) :attr:`content` was cut to, set by the tool that answered;
    :meth:`to_mcp` keeps ``structuredContent`` within it too (``None``: no bound)."""

    def to_dict(self) -> dict[str, JSONValue]:
        """``{"content", "details", "is_error"}``."""
        return {"content": self.content, "details": self.details, "is_error": self.is_error}

    def to_openai_chat(self, tool_call_id: str) -> dict[str, JSONValue]:
        """A Chat Completions ``tool`` message answering ``tool_call_id``."""
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.content}

    def to_openai_responses(self, call_id: str) -> dict[str, JSONValue]:
        """A Responses API ``function_call_output`` input item answering ``call_id``."""
        return {"type": "function_call_output", "call_id": call_id, "output": self.content}

    def to_anthropic(self, tool_use_id: str) -> dict[str, JSONValue]:
        """An Anthropic ``tool_result`` content block answering ``tool_use_id``."""
        return {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": self.content,
            "is_error": self.is_error,
        }

    def to_mcp(self) -> dict[str, JSONValue]:
        """An MCP ``tools/call`` result, valid on protocol 2026-07-28 and 2025-11-25.

        ``content`` is one text block (the text a model reads), ``structuredContent`` a
        copy of :attr:`details` cut to :attr:`content_limit` like the text (it matches the
        tool's ``outputSchema``; see ``_structured``), ``isError`` the flag and
        ``resultType`` ``"complete"``: 2026-07-28 requires it and earlier peers ignore it.
        """
        if self.content_limit is None:
            structured = copy.deepcopy(self.details)
        else:
            structured = bounded_details(self.details, self.content_limit)
        return {
            "content": [{"type": "text", "text": self.content}],
            "structuredContent": structured,
            "isError": self.is_error,
            "resultType": "complete",
        }


Handler = Callable[[dict[str, object], ToolSpan], Awaitable[ToolResult]]


@attrs.frozen(kw_only=True)
class Tool:
    """One tool: what a model sees (name, description, schema) and how it runs.

    Every tool is not cacheable: the same arguments give different answers over time.
    """

    name: str
    """The name a model calls it by."""
    title: str
    """A short human-readable title (MCP ``title``)."""
    description: str
    """When to use it, what it returns and its limits, written for a model."""
    input_schema: dict[str, JSONValue]
    """JSON Schema (draft 2020-12) of the arguments; ``additionalProperties`` is false."""
    output_schema: dict[str, JSONValue] = attrs.field(factory=lambda: {"type": "object"})
    """JSON Schema (draft 2020-12) of :attr:`ToolResult.details`: the answer or an error
    (by default only what every ``details`` is, an object)."""
    annotations: dict[str, bool] = attrs.field(factory=dict)
    """MCP behaviour hints (``readOnlyHint``, ``destructiveHint``, ...)."""
    engine_timeout: float | None = None
    """The host's per-tool timeout this tool was built for (``None``: none)."""
    cacheable: bool = False
    """Always False: never cache a result of these tools."""
    _params: tuple[Param, ...] = attrs.field(alias="params", repr=False)
    _handler: Handler = attrs.field(alias="handler", repr=False, eq=False)
    _transfers: bool = attrs.field(alias="transfers", default=False, repr=False)
    _capture_content: bool = attrs.field(alias="capture_content", default=False, repr=False)
    _telemetry: Telemetry | None = attrs.field(
        alias="telemetry", default=None, repr=False, eq=False
    )
    _session: str | None = attrs.field(alias="session", default=None, repr=False, eq=False)
    _content_limit: int | None = attrs.field(alias="content_limit", default=None, repr=False)

    async def execute(self, args: object, *, call_id: str | None = None) -> ToolResult:
        """Validate ``args`` (an object or its JSON text) and run the tool.

        Never raises: bad input, unknown ids, refusals and internal failures come back as
        a :class:`ToolResult` with ``is_error=True``. Only the caller's own cancellation
        propagates (a cancelled ``wait_agent`` consumes nothing). Each call runs inside
        an ``execute_tool`` span, which records the arguments and the result when the
        manager's ``capture_content`` is on.
        """
        parsed: dict[str, object] | None = None
        problem: ArgumentError | None = None
        try:
            parsed = self.parse_arguments(args)
        except ArgumentError as exc:
            problem = exc
        target = None
        if self._transfers and parsed is not None and isinstance(parsed.get("agent"), str):
            target = str(parsed["agent"])

        async def run(span: ToolSpan) -> ToolResult:
            if problem is not None or parsed is None:
                assert problem is not None
                return _invalid(problem)
            try:
                return await self._handler(parsed, span)
            except Exception as exc:
                return error_result(exc, self.name)

        captured = arguments_text(args, parsed) if self._capture_content else None
        result = await traced(
            self.name,
            call_id,
            target,
            run,
            description=self.description,
            capture=self._capture_content,
            arguments=captured,
            parameters=self.input_schema,
            telemetry=self._telemetry,
            session=self._session,
        )
        if self._content_limit is None:
            return result
        return attrs.evolve(result, content_limit=self._content_limit)

    def parse_arguments(self, args: object) -> dict[str, object]:
        """``args`` (an object or its JSON text) as :meth:`execute` runs the tool with them:
        the fields given, normalised (integers as ``int``, task ids as a de-duplicated
        ``list[str]``). Runs nothing; a host checks a call with it before acting on it.
        It checks the schema: what a tool refuses of valid-looking values (a spawn's name
        grammar, a budget's units) it answers when it runs, as ``invalid_arguments`` too.

        Raises:
            ValueError: the arguments are invalid; the message names the field for a model.
        """
        try:
            return parse_args(self.name, self._params, args)
        except ArgumentError:
            raise
        except Exception as exc:  # a hostile Mapping; never let it escape as itself
            raise ArgumentError(f"{self.name} arguments could not be read: {exc!r}") from exc

    def to_openai_chat(self, *, strict: bool = False) -> dict[str, JSONValue]:
        """This tool as an OpenAI Chat Completions function tool."""
        return to_openai_chat(self, strict=strict)

    def to_openai_responses(self, *, strict: bool = False) -> dict[str, JSONValue]:
        """This tool as an OpenAI Responses API function tool."""
        return to_openai_responses(self, strict=strict)

    def to_anthropic(self) -> dict[str, JSONValue]:
        """This tool as an Anthropic Messages tool."""
        return to_anthropic(self)

    def to_mcp(self) -> dict[str, JSONValue]:
        """This tool as an MCP tool descriptor."""
        return to_mcp(self)


async def traced(
    tool: str,
    call_id: str | None,
    target: str | None,
    run: Callable[[ToolSpan], Awaitable[ToolResult]],
    *,
    description: str | None = None,
    capture: bool = False,
    arguments: str | None = None,
    parameters: Mapping[str, JSONValue] | None = None,
    telemetry: Telemetry | None = None,
    session: str | None = None,
) -> ToolResult:
    """``run`` inside the ``execute_tool`` span of ``tool``, traced by ``telemetry`` (the
    tool's manager's; see :func:`tool_span`); a tracer that fails to open or close the
    span is logged and never breaks the call (``run`` itself must not raise). With
    ``capture``, the call's content is recorded as what it answered. ``session`` is the
    session the tools act for: a call outside any subagent (the host's own, often a
    trace's root span) belongs to that session's conversation.

    Every call is a checkpoint (it yields once before ``run``, where cancelling it changes
    nothing): a host polling ``wait_agent`` with ``timeout_ms: 0`` in a loop lets the
    children it polls run instead of starving them."""
    await anyio.lowlevel.checkpoint()
    result: ToolResult | None = None
    try:
        with ExitStack() as stack:
            try:
                span = stack.enter_context(
                    tool_span(
                        tool,
                        call_id=call_id,
                        transfer_target=target,
                        description=description,
                        arguments=arguments,
                        parameters=parameters,
                        telemetry=telemetry,
                        conversation_id=_conversation(telemetry, session),
                    )
                )
            except Exception:
                logger.exception("could not open the span of tool %s", tool)
                span = ToolSpan()
            result = await run(span)
            if result.is_error:
                span.set_error(
                    tool_error_type(result.details), bound_text(result.content, _DESCRIPTION_CHARS)
                )
            if capture:
                span.set_result(result.content, failed=result.is_error)
    except Exception as exc:  # only the span's exit can get here
        logger.exception("could not close the span of tool %s", tool)
        if result is None:
            result = error_result(exc, tool)
    return result


_DESCRIPTION_CHARS: Final = 300
"""Bound of the span status description of a failed call (the start of its content)."""


def _conversation(telemetry: Telemetry | None, session: str | None) -> str | None:
    """The conversation of a call of ``session``'s tools made outside any subagent."""
    if telemetry is None or not session or not telemetry.conversation_id:
        return None
    return conversation_of(session, telemetry.conversation_id)


def arguments_text(args: object, parsed: dict[str, object] | None) -> str:
    """The call's arguments as JSON text for the span: as parsed when they were valid, else
    as the host sent them (a hostile object becomes a placeholder, never an exception)."""
    if isinstance(args, str) and parsed is None:
        return str.__str__(args)
    try:
        return dumps_str(parsed if parsed is not None else args)
    except Exception:
        try:
            return repr(args)
        except Exception:
            return "<unreadable arguments>"


def tool_error_type(details: Mapping[str, object]) -> str:
    """The ``error.type`` of a failed call: the exception class (``details["error_type"]``)
    when one is known, else the stable error code (``details["error"]``), else ``_OTHER``."""
    for key in ("error_type", "error"):
        value = details.get(key)
        if isinstance(value, str) and value:
            return value
    return "_OTHER"


def make_tool(
    *,
    name: str,
    title: str,
    description: str,
    params: Sequence[Param],
    output_schema: Mapping[str, JSONValue],
    handler: Handler,
    annotations: Mapping[str, bool],
    engine_timeout: float | None,
    content_limit: int | None = None,
    transfers: bool = False,
) -> Tool:
    """Build a :class:`Tool` whose schema is derived from ``params``; its results carry
    ``content_limit`` (the bound its handler cuts their text to)."""
    return Tool(
        name=name,
        title=title,
        description=description,
        input_schema=schema_for(params),
        output_schema=dict(output_schema),
        annotations=dict(annotations),
        engine_timeout=engine_timeout,
        params=tuple(params),
        handler=handler,
        transfers=transfers,
        content_limit=content_limit,
    )


def _invalid(exc: ArgumentError) -> ToolResult:
    details: dict[str, JSONValue] = {"error": "invalid_arguments"}
    if exc.field is not None:
        details["field"] = exc.field
    return ToolResult(content=f"invalid arguments: {exc}", details=details, is_error=True)


def error_result(exc: Exception, tool: str) -> ToolResult:
    """The model-facing :class:`ToolResult` of an exception raised while running ``tool``."""
    if isinstance(exc, ArgumentError):
        return _invalid(exc)
    if isinstance(exc, UnknownAgent):
        # A model can act on a list of names, up to a bound: past it, the closest ones
        # and list_agents, which describes them all.
        known = exc.known[:_UNKNOWN_AGENT_NAMES]
        details: dict[str, JSONValue] = {
            "error": "unknown_agent",
            "agent": bound_text(exc.name, 128),  # what the model sent: bounded
            "known": [*known],
        }
        if len(exc.known) <= _UNKNOWN_AGENT_NAMES:
            text = f"unknown agent {bound_text(repr(exc.name), 80)}; registered agents: "
            text += ", ".join(known) + ". Pick one of those"
        else:
            details["registered"] = len(exc.known)
            text = f"{exc}. Pick one of those, or call list_agents to see all {len(exc.known)}"
        return ToolResult(
            content=f"{text} (call list_agents for their descriptions).",
            details=details,
            is_error=True,
        )
    if isinstance(exc, UnknownTask):
        return ToolResult(
            content=f"{exc} Check the id returned by spawn_agent (call list_agents to see "
            "this session's tasks).",
            details={
                "error": "unknown_task",
                "task_id": exc.task_id,
                "suggestions": list(exc.suggestions),
            },
            is_error=True,
        )
    if isinstance(exc, UnknownPeer):
        return ToolResult(
            content=f"{bound_text(str(exc), 300)}. Call list_agents to see your peers' ids "
            "and paths.",
            details={
                "error": "unknown_peer",
                "field": "to",
                "suggestions": [bound_text(s, 128) for s in exc.suggestions],
            },
            is_error=True,
        )
    if isinstance(exc, SpawnRejected):
        # The exception speaks to programmers; what the model should do is said here.
        hint = _SPAWN_REJECTED_HINTS.get(exc.reason, "do the task yourself instead")
        refused: dict[str, JSONValue] = {"error": "spawn_rejected", "reason": exc.reason}
        if exc.task_id is not None:
            refused["task_id"] = exc.task_id  # the task holding the idempotency key
        return ToolResult(content=f"{tool} refused: {exc}; {hint}.", details=refused, is_error=True)
    if isinstance(exc, InvalidName):
        return ToolResult(
            content=f"invalid arguments: name must be a valid agent name ({exc.reason}), "
            f"got {bound_text(repr(exc.name), 80)}",
            details={"error": "invalid_arguments", "field": "name"},
            is_error=True,
        )
    if isinstance(exc, ConfigError):
        return ToolResult(
            content=f"invalid arguments: {bound_text(str(exc), 300)}",
            details={"error": "invalid_arguments", "field": exc.field},
            is_error=True,
        )
    logger.exception("tool %s failed", tool)
    error_type, message = describe_exception(exc)
    return ToolResult(
        content=f"{tool} failed inside the library ({message}); this is not caused by your "
        "arguments. Try again once; if it fails again, do the task yourself.",
        details={"error": "internal", "error_type": error_type},
        is_error=True,
    )


@attrs.frozen(kw_only=True)
class ToolLimits:
    """The timeouts and bounds a :class:`Toolset` was built with (seconds, characters)."""

    engine_timeouts: dict[str, float | None]
    """The host's per-tool timeout of each tool (``None``: the host sets none)."""
    wait_timeout: float
    """``wait_agent``'s wait when the model gives no ``timeout_ms``."""
    wait_ceiling: float
    """The longest any ``wait_agent`` call waits: host timeout minus the margin, or the
    ``wait_cap`` given to :func:`build_tools` if that is lower."""
    delegate_ceiling: float | None
    """The longest a ``delegate_to_agent`` child may run (host timeout minus margin)."""
    truncate_chars: int
    """Bound of the text a model reads from one tool call."""
    return_mode: ReturnMode
    """``delegate_to_agent``'s return form: ``envelope`` or the legacy ``string``."""


_SPAWN_REJECTED_HINTS: Final = {
    "depth": "do this task yourself instead of delegating it",
    "session_closed": "this session can no longer delegate: do the task yourself",
    "manager_closed": "subagents are not available now: do the task yourself",
    "idempotency_conflict": "to run a different task, give it a new idempotency_key; to "
    "get that task's result, call wait_agent with its task id",
    "idempotency_pending": "call spawn_agent with the same arguments again later (it then "
    "answers with that task), or do the task yourself",
    "budget_exhausted": "do the rest yourself",
    "max_children": "wait for one of your subagents to finish (wait_agent) before starting "
    "another, or do the task yourself",
    "max_agents": "wait for running subagents to finish (wait_agent) before starting "
    "another, or do the task yourself",
}
"""What a model should do about each :class:`SpawnRejected` reason."""

_UNKNOWN_AGENT_NAMES: Final = 50
"""An unknown-agent tool error lists every registered agent up to this many."""
